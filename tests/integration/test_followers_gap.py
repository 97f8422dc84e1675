"""Followers across daemon restarts (the outside review s19f, findings 2 and 6): ``log
--follow --json`` shows the restart as ``watch --json`` does, and ``watch
--follow-restarts`` shows the turns run before it could subscribe again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import (
    SUBSTRAT,
    cli_root,
    kill_daemon,
    read_json_until,
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
