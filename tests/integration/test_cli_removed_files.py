"""Files removed by hand under a live daemon (finding 4 of the s17c outsider review).

Without its socket the daemon cannot be reached, and without ``daemon.lock`` the
lock says nothing of it; but it still holds the root (its flock on the root
directory). ``daemon status`` names its pid (exit 3) instead of "no daemon
running", and ``daemon stop`` stops it instead of saying there is none.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.client import Client
from substrat.errors import DaemonNotRunningError, DaemonUnreachableError
from substrat.rootdir import prepare_root
from substrat.rpc import lock
from substrat.rpc.transport import socket_path
from tests.support.cli import SUBSTRAT, as_json, cli_root, run, spawn

pytestmark = [
    pytest.mark.waits,
    pytest.mark.skipif(
        not SUBSTRAT or not os.path.exists("/proc/locks"),
        reason="needs the substrat console script and /proc/locks",
    ),
]


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
    assert "it serves, but will never answer there" in " ".join(status.stdout.split())
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


def test_a_command_fails_at_once_when_a_serving_daemon_lost_its_socket(root: Path) -> None:
    # It used to wait out the start's 60 s limit for a daemon that will never answer.
    pid = as_json(run(root, "daemon", "start", "--json"))["pid"]
    socket_path(root).unlink()
    for args in (["agent", "list"], ["agent", "create", "a"], ["daemon", "start"]):
        proc = run(root, *args, timeout_s=30)
        assert proc.returncode == 3, (args, proc.stderr)
        assert (
            f"daemon pid {pid} is running but its socket {socket_path(root)} is gone; "
            f"`substrat daemon restart --root {root}`"
        ) in " ".join(proc.stderr.split()), args
    err = run(root, "agent", "list", "--json", timeout_s=30)
    assert err.returncode == 3
    body = as_json_any(err.stderr)
    assert isinstance(body, dict) and "socket" in body["error"]["message"]
    assert alive(pid)

    restarted = run(root, "daemon", "restart", timeout_s=60)  # what the message says to do
    assert restarted.returncode == 0, restarted.stderr
    new_pid = as_json(run(root, "daemon", "status", "--json"))["pid"]
    assert new_pid != pid and not alive(pid)

    lock.lock_path(root).unlink()  # the lock says nothing now; the daemon still holds the root
    socket_path(root).unlink()
    proc = run(root, "agent", "list", timeout_s=30)
    assert proc.returncode == 3, proc.stderr
    assert f"daemon pid {new_pid} is running but its socket" in proc.stderr
    assert "(and its lock file daemon.lock)" in proc.stderr
    assert run(root, "daemon", "restart", timeout_s=60).returncode == 0
    assert as_json(run(root, "agent", "list", "--json")) == []


# A real daemon held in its recovery (before it binds its socket) until the test lets it go.
HELD = """
import os, signal, sys
from substrat.daemon import main
from substrat.orchestrator import Orchestrator
opened = Orchestrator.open.__func__
async def held(cls, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGSTOP)
    return await opened(cls, *args, **kwargs)
Orchestrator.open = classmethod(held)
sys.exit(main(sys.argv[1:]))
"""


def test_a_command_waits_for_a_daemon_still_recovering(root: Path) -> None:
    prepare_root(root)
    with open(root / "daemon.log", "ab") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-c", HELD, "--root", str(root)],
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while _state(daemon.pid) != "T":  # stopped in its recovery
            assert daemon.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        info = lock.read_info(root)
        assert info is not None and info.state == "running" and info.socket_ino is None
        listing = spawn(root, "agent", "list", "--json")
        with pytest.raises(subprocess.TimeoutExpired):  # it waits; it does not give up
            listing.wait(timeout=5)
        os.kill(daemon.pid, signal.SIGCONT)
        out, err = listing.communicate(timeout=60)
        assert listing.returncode == 0, err
        assert as_json_any(out) == []
        answered = lock.read_info(root)
        assert answered is not None and answered.pid == daemon.pid
        assert answered.socket_ino == os.stat(socket_path(root)).st_ino
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
        daemon.terminate()
        daemon.wait(timeout=30)


def test_a_dead_daemons_record_is_not_taken_for_a_lost_socket(root: Path) -> None:
    # The next daemon holds the lock and has not written its own record yet: the record
    # still says "running" with the dead one's socket_ino. That one is starting.
    pid = as_json(run(root, "daemon", "start", "--json"))["pid"]
    os.kill(pid, signal.SIGKILL)
    while lock.is_held(root):
        time.sleep(0.01)
    socket_path(root).unlink()
    starting = lock.RootLock.acquire(root)
    try:
        info = lock.read_info(root)
        assert info is not None and info.pid == pid and info.socket_ino is not None
        assert lock.socket_gone(root) is None
        with pytest.raises(DaemonNotRunningError) as raised:
            Client(root).connect()
        assert not isinstance(raised.value, DaemonUnreachableError)
    finally:
        starting.release()


def as_json_any(text: str) -> object:
    import json

    return json.loads(text)
