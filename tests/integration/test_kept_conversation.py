"""An agent's first turn after a start is restored from the conversation recovery's read of
its log built (``LogPool.keep_conversation``), not from a second read of the log; a log
changed in between (an append, a seal, a write from outside, the file replaced, the log
closed) is read again. Real files, the real orchestrator.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from substrat import events, live_sessions, start_summary
from substrat.checkpointer import CheckpointPolicy
from substrat.conversation import conversation_from_log
from substrat.logline import encode_entry
from substrat.orchestrator import Orchestrator
from substrat.providers.base import TurnRecord
from substrat.session import SessionStore


def _after_a_kill(root: Path) -> str:
    """A root whose agent ``ada`` has two turns, no blob to restore from and no
    checkpoint, started as after a kill (no start summary): recovery reads its log
    whole. Its session id."""

    async def make() -> str:
        orch = await Orchestrator.open(root, checkpoints=CheckpointPolicy.off())
        try:
            info = await orch.create_root("ada", "ada instructions")
            await orch.run_turn("ada", "one")
            await orch.run_turn("ada", "two")
            return info.session_id
        finally:
            await orch.close()

    sid = asyncio.run(make())
    Path(start_summary.summary_path(root)).unlink(missing_ok=True)
    store = SessionStore(root)
    record = store.load(sid)
    record.provider_state = b""  # a kill before the suspend: the log is all there is
    store.save(record)
    return sid


class Reads:
    """``conversation_from_log`` as the session restore calls it, counted."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, path: Path) -> list[TurnRecord]:
        self.calls += 1
        return conversation_from_log(path)


def _first_turn(
    root: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[[Orchestrator, str], None]
) -> tuple[str, int, list[str]]:
    """Start the root, apply ``change`` to ada's log, run ada's first turn: its response's
    first line, the log reads the restore made, the turn ids of the history then."""
    sid = _after_a_kill(root)
    reads = Reads()
    monkeypatch.setattr(live_sessions, "conversation_from_log", reads)

    async def go() -> tuple[str, int, list[str]]:
        orch = await Orchestrator.open(root)
        try:
            assert orch.recovery_report is not None
            assert sid in orch.recovery_report.read_in_full
            change(orch, sid)
            result = await orch.run_turn("ada", "three")
            history = [t.turn_id for t in orch.history(orch.get("ada").agent_id)]
            return result.response.split("\n", 1)[0], reads.calls, history
        finally:
            await orch.close()

    return asyncio.run(go())


def test_the_first_turn_after_a_start_does_not_read_the_log_again(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, reads, history = _first_turn(root, monkeypatch, lambda orch, sid: None)
    assert reads == 0, "restored from recovery's read of the log"
    # the scripted reply numbers the turn and chains every prompt before it: a history
    # that lacked a turn or held another would answer otherwise
    assert first.startswith("#3 ")
    assert history == ["t1", "t2", "t3"]


def _append_a_turn(orch: Orchestrator, sid: str) -> None:
    """A turn committed to the log after recovery read it (as a turn of this process)."""
    log = orch.logs.get(sid)
    log.log(events.TURN_START, {"turn_id": "t3", "prompt": "between"})
    log.log(events.TURN_COMPLETE, {"turn_id": "t3", "prompt": "between", "response": "r"})


def _seal(orch: Orchestrator, sid: str) -> None:
    assert orch.logs.roll(sid) is not None


def _append_from_outside(orch: Orchestrator, sid: str) -> None:
    """A committed turn written to the file by another writer: the pool does not know."""
    path = orch.logs.path(sid)
    seq = orch.logs.end(sid).last_seq  # type: ignore[union-attr]
    with open(path, "ab") as handle:
        for offset, event in enumerate((events.TURN_START, events.TURN_COMPLETE), 1):
            data = {"turn_id": "t3", "prompt": "between", "response": "r"}
            handle.write(encode_entry({"seq": seq + offset, "event": event, "data": data}))


def _replace(orch: Orchestrator, sid: str) -> None:
    """The file swapped for a copy of itself (another inode, the same size)."""
    path = orch.logs.path(sid)
    shutil.copyfile(path, f"{path}.copy")
    os.replace(f"{path}.copy", path)


def _close(orch: Orchestrator, sid: str) -> None:
    orch.logs.close(sid)


@pytest.mark.parametrize(
    ("change", "turns"),
    [(_append_a_turn, 4), (_seal, 3), (_append_from_outside, 4), (_replace, 3), (_close, 3)],
)
def test_a_log_changed_since_recovery_read_it_is_read_again(
    root: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[..., None], turns: int
) -> None:
    first, reads, history = _first_turn(root, monkeypatch, change)
    assert reads == 1, "the log changed since recovery's read: read again"
    assert first.startswith(f"#{turns} ")
    assert len(history) == turns


@pytest.mark.parametrize("torn", [False, True])
def test_the_stamp_is_the_repairs_own_stat_unless_the_repair_wrote(
    root: Path, monkeypatch: pytest.MonkeyPatch, torn: bool
) -> None:
    """Recovery's repair fstats the file it read; the conversation is kept with that stat
    (no stat of the log again), unless the repair wrote the file (a torn tail cut): then
    the file is stat'ed as it is now. Either way the first turn reads no log."""
    from substrat.logs import LogPool, _stamp

    sid = _after_a_kill(root)
    log_path = SessionStore(root).log_path(sid)
    if torn:
        with open(log_path, "ab") as handle:
            handle.write(b'{"crc":"00')  # a torn append: the repair cuts it
    given: list[os.stat_result | None] = []
    keep = LogPool.keep_conversation

    def spy(self: LogPool, endpoint: str, turns: list[TurnRecord], stat: Any = None) -> None:
        if endpoint == sid:
            given.append(stat)
        keep(self, endpoint, turns, stat)

    monkeypatch.setattr(LogPool, "keep_conversation", spy)
    reads = Reads()
    monkeypatch.setattr(live_sessions, "conversation_from_log", reads)

    async def go() -> str:
        orch = await Orchestrator.open(root)
        try:
            (stat,) = given
            if torn:
                assert stat is None, "the repair cut the file: its stat before is not the file's"
            else:
                assert stat is not None and _stamp(stat) == _stamp(os.stat(log_path))
            return (await orch.run_turn("ada", "three")).response.split("\n", 1)[0]
        finally:
            await orch.close()

    assert asyncio.run(go()).startswith("#3 ")
    assert reads.calls == 0
