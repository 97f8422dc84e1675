"""``watch`` catches up no turn from before it started (an outsider's kill -9 drill).

The outsider ran a turn, started ``watch``, killed the daemon mid-turn a few seconds
later and restarted it: after the ``connection.gap`` line ("events between 21:03:37
and 21:03:42 may be missing") watch showed the turn of 21:03:34, from before it
started, "(caught up from its log)". The catch-up reads the logs from 5 s before the
last event received (an entry is logged before its event is sent), and a watch that
had received nothing yet counted from its own start, so the margin reached back
before it. Here the real command runs in-process on a real root and a real agent log;
only the daemon's stream is stood in for (a drop, then a restart), so the turn
before the watch is a few milliseconds before it, as no process start allows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from substrat.cli import events_cmds, main
from substrat.eventlog import EventLog
from substrat.rootdir import prepare_root

SESSION = "0123456789abcdef0123456789abcdef"
AGENT = "fedcba9876543210fedcba9876543210"


class _Conn:
    def call(self, method: str, params: Any = None) -> Any:
        assert method == "agent.list", method
        return [{"agent_id": AGENT, "session_id": SESSION, "path": "a"}]


def test_a_turn_logged_before_watch_started_is_not_caught_up_and_one_in_the_gap_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = prepare_root(tmp_path / "root")
    (root / "agents" / SESSION).mkdir(parents=True)
    log = EventLog(root / "agents" / SESSION / "events.jsonl", {"session_id": SESSION})
    log.log("turn.start", {"turn_id": "t1", "prompt": "before the watch"})
    log.log("turn.complete", {"turn_id": "t1", "prompt": "before the watch", "response": "r"})

    def stream(opts: Any, wanted: Any, *, catch_up: Any, **_: Any) -> Iterator[Any]:
        yield "connection.lost", {"time": "2026-01-01T00:00:00+00:00"}
        log.log("turn.start", {"turn_id": "t2", "prompt": "in the gap"})  # went to nobody
        recovered = ("daemon.recovered", {"previous_shutdown": "unclean"})
        yield recovered
        yield from catch_up(_Conn(), [recovered])

    monkeypatch.setattr(events_cmds, "stream_events", stream)
    try:
        result = CliRunner().invoke(main, ["watch", "--json", "--root", str(root)])
    finally:
        log.close()
    assert result.exit_code == 0, result.output
    shown = [json.loads(line) for line in result.output.splitlines()]
    caught = [
        (e["event"], e["params"]["turn_id"]) for e in shown if e["params"].get("caught_up") is True
    ]
    assert caught == [("turn.started", "t2")], shown
    (gap,) = [e["params"] for e in shown if e["event"] == "connection.gap"]
    assert gap["caught_up"] == 1
