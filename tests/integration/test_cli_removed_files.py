"""Files removed by hand under a live daemon (finding 4 of the s17c outsider review).

Without its socket the daemon cannot be reached, and without ``daemon.lock`` the
lock says nothing of it; but it still holds the root (its flock on the root
directory). ``daemon status`` names its pid (exit 3) instead of "no daemon
running", and ``daemon stop`` stops it instead of saying there is none.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.rpc import lock
from substrat.rpc.transport import socket_path
from tests.support.cli import SUBSTRAT, as_json, cli_root, run

pytestmark = pytest.mark.skipif(
    not SUBSTRAT or not os.path.exists("/proc/locks"),
    reason="needs the substrat console script and /proc/locks",
)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_status_and_stop_name_a_daemon_whose_files_were_removed(root: Path) -> None:
    started = as_json(run(root, "daemon", "start", "--json"))
    pid = started["pid"]
    socket_path(root).unlink()
    status = run(root, "daemon", "status")
    assert status.returncode == 3
    assert f"daemon pid {pid} holds the root but does not answer" in status.stdout
    assert "daemon.sock is gone" in status.stdout
    assert "no daemon running" not in status.stdout

    lock.lock_path(root).unlink()
    status = run(root, "daemon", "status", "--json")
    assert status.returncode == 3
    assert as_json_any(status.stdout) == {
        "running": True,
        "answering": False,
        "pid": pid,
        "root": str(root),
    }
    assert run(root, "daemon", "status", "--pid").stdout.strip() == str(pid)

    stopped = run(root, "daemon", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert f"daemon stopped (pid {pid})" in stopped.stdout
    assert not alive(pid)
    again = as_json(run(root, "daemon", "start", "--json"))  # the root is free again
    assert again["started"] and again["pid"] != pid


def as_json_any(text: str) -> object:
    import json

    return json.loads(text)
