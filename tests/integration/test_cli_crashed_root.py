"""A root whose daemon was SIGKILLed mid-turn, then opened by a command
(findings 2 and 8 of the s17c outsider review).

* Whichever command runs the crash recovery reports it, once: ``compact`` says
  what ``recover`` says (the lost turn) and marks the lock recovered, so the
  next ``daemon start`` says the root was recovered offline instead of finding
  nothing and saying nothing; ``fsck`` without ``--repair`` does not recover.
* After two crashes in a row the report shows the user's prompt, not the notice
  substrat put before it, and the agent's next prompt lists both lost turns in
  one notice instead of wrapping the first notice in the second.
* A message still pending after a CLEAN stop (one the user has not collected) is
  not "redelivered": every start puts the pending messages back into their inboxes,
  but only after a crash is that a redelivery worth a report (outside review of
  session 17, item 2).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.rpc import lock
from tests.support.cli import SUBSTRAT, as_json, cli_root, kill_daemon, run, spawn, wait_busy

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def crash_mid_turn(root: Path, prompt: str) -> None:
    """``agent send`` a slow turn, SIGKILL the daemon once the turn is logged as started."""
    sender = spawn(root, "agent", "send", "slow", prompt, stdin=subprocess.DEVNULL)
    wait_busy(root)
    kill_daemon(root)
    _out, err = sender.communicate(timeout=60)
    assert sender.returncode == 3, err


def test_compact_after_a_kill_reports_the_lost_turn_and_marks_the_lock(root: Path) -> None:
    run(root, "agent", "create", "slow", "--provider", "paced")
    crash_mid_turn(root, "@pace 5000ms crashturn")
    checked = run(root, "fsck")  # reads only: the recovery is left to whoever runs it
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert lock.read_info(root).state == "running"  # type: ignore[union-attr]

    compacted = run(root, "compact")
    assert compacted.returncode == 0, compacted.stderr
    assert "the previous daemon died without shutting down" in compacted.stdout
    assert "lost in flight: slow turn t1 (prompt: @pace 5000ms crashturn)" in compacted.stdout
    assert "compact: " in compacted.stdout
    info = lock.read_info(root)
    assert info is not None and info.state == "stopped"
    assert info.recovered_by == "substrat compact"

    stopped = run(root, "daemon", "status")
    assert "did not shut down cleanly" not in stopped.stdout + stopped.stderr
    started = run(root, "daemon", "start")
    assert started.returncode == 0, started.stderr
    assert "lost in flight" not in started.stdout  # said once, by compact
    status = as_json(run(root, "daemon", "status", "--json"))
    assert status["previous_shutdown"] == "recovered"


def test_compact_json_carries_the_recovery_it_ran(root: Path) -> None:
    run(root, "agent", "create", "slow", "--provider", "paced")
    crash_mid_turn(root, "@pace 5000ms crashturn")
    report = as_json(run(root, "compact", "--json"))
    assert report["recovery"]["previous_shutdown"] == "unclean"
    lost = report["recovery"]["report"]["lost_turns"]
    assert [(t["turn_id"], t["prompt"]) for t in lost] == [("t1", "@pace 5000ms crashturn")]
    again = as_json(run(root, "compact", "--json"))  # nothing left to recover: nothing said
    assert again["recovery"] is None


def test_two_crashes_in_a_row_show_the_users_prompts_and_one_flat_notice(root: Path) -> None:
    run(root, "agent", "create", "slow", "--provider", "paced")
    crash_mid_turn(root, "@pace 5000ms first cut")
    first = run(root, "daemon", "start")
    assert "lost in flight: slow turn t1 (prompt: @pace 5000ms first cut)" in first.stdout
    crash_mid_turn(root, "@pace 5000ms second cut")  # its prompt carried the notice of t1
    second = run(root, "daemon", "start")
    assert "lost in flight: slow turn t2 (prompt: @pace 5000ms second cut)" in second.stdout
    assert "[substrat" not in second.stdout
    shown = as_json(run(root, "agent", "show", "slow", "--json"))
    assert shown["lost_turn"]["prompt"].endswith("@pace 5000ms second cut")

    sent = run(root, "agent", "send", "slow", "where were we?")
    assert sent.returncode == 0, sent.stderr
    turns = as_json(run(root, "log", "slow", "--json"))["turns"]
    told = turns[-1]["prompt"]
    assert told == (
        "[substrat: the daemon restarted. Your turns t1 (prompt: '@pace 5000ms first cut') "
        "and t2 (prompt: '@pace 5000ms second cut') were lost in flight, one after the other "
        "(the daemon restarted after each): none of their tool calls took effect.]\n"
        "where were we?"
    )


def message_for_the_user(root: Path) -> str:
    assert run(root, "agent", "create", "lead").returncode == 0
    sent = run(root, "agent", "send", "lead", "done\n@send user the report is ready")
    assert sent.returncode == 0, sent.stderr
    (message,) = as_json(run(root, "inbox", "--json"))["messages"]
    return str(message["message_id"])


def test_a_clean_restart_does_not_report_a_waiting_message_as_redelivered(root: Path) -> None:
    message_id = message_for_the_user(root)
    assert run(root, "daemon", "stop").returncode == 0
    started = run(root, "daemon", "start")
    assert started.returncode == 0, started.stderr
    assert "redelivered" not in started.stdout + started.stderr
    status = as_json(run(root, "daemon", "status", "--json"))
    assert status["previous_shutdown"] == "clean" and status["last_recovery"] is None
    assert [m["message_id"] for m in as_json(run(root, "inbox", "--json"))["messages"]] == [
        message_id
    ]  # still there, once

    assert run(root, "daemon", "stop").returncode == 0
    for args in (["recover"], ["compact"]):  # offline recoveries say the same
        offline = run(root, *args)
        assert offline.returncode == 0, (args, offline.stderr)
        assert "redelivered" not in offline.stdout, args
    recovered = as_json(run(root, "recover", "--json"))
    assert recovered["redelivered"] == [] and recovered["waiting"] == [message_id]


def test_a_crash_still_reports_the_message_redelivered(root: Path) -> None:
    message_id = message_for_the_user(root)
    kill_daemon(root)  # SIGKILL: the message was never collected
    started = run(root, "daemon", "start")
    assert started.returncode == 0, started.stderr
    assert "messages redelivered: 1" in started.stdout
    status = as_json(run(root, "daemon", "status", "--json"))
    assert status["previous_shutdown"] == "unclean"
    assert status["last_recovery"]["report"]["redelivered"] == [message_id]
