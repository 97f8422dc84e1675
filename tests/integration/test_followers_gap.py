"""Followers across daemon restarts (the outside review s19f, findings 2 and 6): ``log
--follow --json`` shows the restart as ``watch --json`` does, and ``watch
--follow-restarts`` shows the turns run before it could subscribe again."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import (
    SUBSTRAT,
    cli_root,
    kill_daemon,
    read_json_until,
    read_lines_until,
    run,
    spawn,
    wait_subscribed,
)

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="needs the substrat console script")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def test_log_follow_json_shows_the_restart_as_watch_json_does(root: Path) -> None:
    assert run(root, "agent", "create", "a").returncode == 0
    assert run(root, "agent", "send", "a", "one").returncode == 0
    follower = spawn(root, "log", "a", "--follow", "--follow-restarts", "--json")
    try:
        read_json_until(follower, lambda e: e.get("turn_id") == "t1")
        wait_subscribed(root, 1)
        kill_daemon(root)
        assert run(root, "daemon", "start").returncode == 0
        seen = read_json_until(follower, lambda e: e["event"] == "connection.restored")
        shown = [e for e in seen if e["event"] != "turn"]
        assert [e["event"] for e in shown] == [
            "connection.lost",
            "daemon.recovered",
            "connection.restored",
        ], seen
        assert all(set(e) == {"event", "params"} for e in shown), shown  # watch --json's shape
        assert shown[1]["params"]["previous_shutdown"] == "unclean"
        assert run(root, "agent", "send", "a", "two").returncode == 0
        (turn,) = read_json_until(follower, lambda e: e.get("turn_id") == "t2")
        assert turn["event"] == "turn" and turn["number"] == 2
    finally:
        follower.terminate()
        follower.communicate(timeout=30)


def test_watch_follow_restarts_catches_up_the_turns_it_was_away_for(root: Path) -> None:
    """Turns run after a clean restart and before watch subscribes again went to nobody;
    watch now shows them from the logs, marked caught up, after a gap notice, and the
    start of a daemon that had nothing to recover."""
    assert run(root, "agent", "create", "a").returncode == 0
    as_json_watch = spawn(root, "watch", "--json", "--follow-restarts")
    people = spawn(root, "watch", "--follow-restarts")
    try:
        wait_subscribed(root, 2)
        assert run(root, "agent", "send", "a", "one").returncode == 0
        # Both watches have t1's end before the stop: an event the stop keeps from a watch
        # is caught up after the restart, and the gap line would count one turn event more.
        read_json_until(
            as_json_watch,
            lambda e: e["event"] == "turn.completed" and e["params"].get("turn_id") == "t1",
        )
        read_lines_until(people, lambda line: "turn.completed" in line and " t1" in line)
        assert run(root, "daemon", "stop").returncode == 0
        read_json_until(as_json_watch, lambda e: e["event"] == "connection.lost")
        for proc in (as_json_watch, people):  # away, as a watch that reconnects late is
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            assert run(root, "agent", "send", "a", "two").returncode == 0  # starts a daemon
            assert run(root, "agent", "send", "a", "three").returncode == 0
        finally:
            for proc in (as_json_watch, people):
                os.kill(proc.pid, signal.SIGCONT)
        seen = read_json_until(as_json_watch, lambda e: e["event"] == "connection.restored")
        names = [e["event"] for e in seen]
        assert names[0] == "daemon.started" and names[1] == "connection.gap", names
        assert seen[0]["params"]["previous_shutdown"] == "clean"
        assert seen[1]["params"]["caught_up"] == 4, seen[1]
        turns = [(e["event"], e["params"]["turn_id"]) for e in seen[2:-1]]
        assert turns == [
            ("turn.started", "t2"),
            ("turn.completed", "t2"),
            ("turn.started", "t3"),
            ("turn.completed", "t3"),
        ], seen
        assert all(e["params"]["caught_up"] is True for e in seen[2:-1])
        assert seen[3]["params"]["response"].startswith("#2 ")
        # The human watch is back too before t4: one that reconnects after t4 was logged
        # rightly catches t4 up as well (6 turn events; seen once in a landing run).
        lines = read_lines_until(people, lambda line: "connection.restored" in line)
        # From here on the live stream, each turn once.
        assert run(root, "agent", "send", "a", "four").returncode == 0
        after = read_json_until(as_json_watch, lambda e: e["event"] == "turn.completed")
        assert [e["params"].get("turn_id") for e in after if "turn" in e["event"]] == ["t4", "t4"]
        assert not any(e["params"].get("caught_up") for e in after)
        lines += read_lines_until(people, lambda line: "turn.completed" in line and " t4" in line)
    finally:
        for proc in (as_json_watch, people):
            proc.terminate()
            proc.communicate(timeout=30)
    said = [line for line in lines if "connection.gap" in line]
    assert len(said) == 1 and "2 turn events" not in said[0], said
    assert "events between " in said[0] and "4 turn events caught up" in said[0], said
    caught = [line for line in lines if "(caught up from its log)" in line]
    assert len(caught) == 4 and "t2" in caught[0], lines
    assert any("daemon.started" in line and "nothing to recover" in line for line in lines)
