"""The tests' daemons forked off a warm server (tests/support/warm_daemons.py).

A forked daemon is compared with a fresh one started as DaemonProcess starts it: what the
process sees of itself (probed with ``python -P -m timeit -s PROBE``, which runs PROBE in
a ``-P -m`` process before anything else of it), what /proc shows of a real daemon, its
log, its exit status on SIGTERM, SIGKILL and a stop, and that nothing is left behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from substrat.client import DaemonProcess, ping, stop_daemon
from tests.support import warm, warm_daemons

PROBE = r"""
import json, os, random, signal, sys
sig = {}
for n in signal.valid_signals():
    try:
        h = signal.getsignal(n)
    except (ValueError, OSError):
        continue
    sig[int(n)] = str(h if h in (signal.SIG_IGN, signal.SIG_DFL, None) else h.__name__)
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass  # the listing's own descriptor, closed since
main = sys.modules["__main__"]
cmdline = open("/proc/self/cmdline", "rb").read().split(b"\0")
print(json.dumps({
    "argv": sys.argv, "orig_argv": sys.orig_argv, "path": sys.path, "flags": list(sys.flags),
    "cwd": os.getcwd(), "env": dict(os.environ), "umask": os.umask(0),
    "session": os.getsid(0) == os.getpid(), "group": os.getpgrp() == os.getpid(),
    "main": sorted(k for k in vars(main) if k != "__builtins__"),
    "main_file": main.__file__, "main_spec": main.__spec__.name,
    "fds": fds, "signals": sig,
    "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "stdio": [(s.name, s.encoding, s.errors, s.line_buffering, s.write_through, s.mode)
              for s in (sys.stdin, sys.stdout, sys.stderr)],
    "cmdline": [a.decode() for a in cmdline if a], "random": random.random(),
}), flush=True)
"""
PROBE_COMMAND = [sys.executable, "-P", "-m", "timeit", "-n", "1", "-r", "1", "-s", PROBE, "pass"]


@pytest.fixture(autouse=True)
def warm_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests test the server: not bypassed by a run that forces fresh processes."""
    monkeypatch.delenv(warm.FRESH, raising=False)


def daemon_server() -> warm.Server:
    server = warm.get_server("daemon")
    assert server is not None
    return server


def probe(log: Path, *, fresh: bool, env: dict[str, str]) -> dict[str, Any]:
    """What PROBE_COMMAND sees of itself, started fresh or forked; its log normalized."""
    with open(log, "ab") as out:
        if fresh:
            proc: Any = subprocess.Popen(
                PROBE_COMMAND,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                close_fds=True,
                env=env,
            )
        else:
            proc = warm_daemons.start(daemon_server(), PROBE_COMMAND, out.fileno(), env)
            assert isinstance(proc, warm_daemons.WarmDaemon)
    assert proc.wait(timeout=60) == 0, log.read_text()
    seen = json.loads(log.read_text().splitlines()[0])
    seen["fds"] = {fd: target.replace(str(log), "LOG") for fd, target in seen["fds"].items()}
    return seen


def test_a_forked_process_sees_itself_as_a_fresh_one(tmp_path: Path) -> None:
    env = {**os.environ, "SUBSTRAT_PROBE": "value with spaces"}
    old = os.umask(0o027)
    try:
        fresh = probe(tmp_path / "fresh.log", fresh=True, env=env)
        forked = probe(tmp_path / "forked.log", fresh=False, env=env)
        again = probe(tmp_path / "again.log", fresh=False, env=env)
    finally:
        os.umask(old)
    assert forked["random"] != again["random"]  # each fork reseeded
    for seen in (fresh, forked):
        del seen["random"]
    assert forked == fresh
    assert fresh["session"] and fresh["umask"] == 0o027
    assert fresh["fds"]["0"] == "/dev/null" and fresh["fds"]["1"] == fresh["fds"]["2"] == "LOG"
    assert set(fresh["fds"]) == {"0", "1", "2"}
    assert fresh["env"]["SUBSTRAT_PROBE"] == "value with spaces"
    assert fresh["cmdline"] == PROBE_COMMAND


def proc_view(pid: int, root: Path) -> dict[str, Any]:
    """What /proc shows of a running daemon, its root's path and pid taken out."""
    status = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    fds = {}
    for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed since the listing: settled_view looks again
            target = "(closed)"
        fds[fd] = re.sub(r"\[\d+\]", "[N]", target.replace(str(root), "ROOT"))
    return {
        "signals": {k: status[k] for k in ("SigBlk", "SigIgn", "SigCgt")},
        "umask": status["Umask"],
        "session": int(stat[3]) == pid and int(stat[2]) == pid,
        "cmdline": Path(f"/proc/{pid}/cmdline")
        .read_bytes()
        .rstrip(b"\0")
        .replace(str(root).encode(), b"ROOT"),
        "cwd": os.readlink(f"/proc/{pid}/cwd"),
        "fds": fds,
    }


def settled_view(pid: int, root: Path, limit_s: float = 10.0) -> dict[str, Any]:
    """:func:`proc_view` once two looks 0.1 s apart agree: a descriptor open for a moment
    (the start's ping, being closed) is not what the daemon keeps."""
    deadline = time.monotonic() + limit_s
    view = proc_view(pid, root)
    while time.monotonic() < deadline:
        time.sleep(0.1)
        view, last = proc_view(pid, root), view
        if view == last:
            break
    return view


def normalized_log(root: Path, pid: int) -> list[str]:
    lines = (root / "daemon.log").read_text().splitlines()
    return [
        re.sub(r"^\S+ \S+ ", "", line).replace(str(root), "ROOT").replace(str(pid), "PID")
        for line in lines
    ]


def start(root: Path, fresh: bool, monkeypatch: pytest.MonkeyPatch) -> DaemonProcess:
    with monkeypatch.context() as patched:
        if fresh:
            patched.setenv(warm.FRESH, "1")
        process = DaemonProcess(root).start()
    assert isinstance(process.proc, subprocess.Popen) == fresh
    return process


def test_a_forked_daemon_runs_stops_and_logs_as_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    views, logs = [], []
    for fresh in (True, False):
        root = tmp_path / ("fresh" if fresh else "forked")
        with start(root, fresh, monkeypatch) as daemon:
            views.append(settled_view(daemon.pid, root))
            assert daemon.terminate() == 0
            logs.append(normalized_log(root, daemon.pid))
    assert views[0] == views[1]
    assert views[0]["session"]
    assert logs[0] == logs[1]
    assert any("stopped cleanly" in line for line in logs[0])


def test_sigkill_stop_and_a_let_go_daemon_as_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for fresh in (True, False):
        root = tmp_path / ("fresh" if fresh else "forked")
        daemon = start(root, fresh, monkeypatch)
        os.kill(daemon.pid, signal.SIGKILL)  # a real SIGKILL of a real process
        assert daemon.wait(60) == -signal.SIGKILL
        assert not Path(f"/proc/{daemon.pid}").exists()  # reaped: not even a zombie
        daemon = start(root, fresh, monkeypatch)  # recovers what the kill left
        assert stop_daemon(root) == daemon.pid
        assert daemon.wait(60) == 0
        daemon = start(root, fresh, monkeypatch)
        pid = daemon.pid
        del daemon  # let go of, as `substrat daemon start` does: it runs on
        time.sleep(0.2)
        assert (ping(root) or {}).get("pid") == pid
        assert stop_daemon(root) == pid
    assert children_left(daemon_server().process.pid) == []


def children_left(pid: int, limit_s: float = 30.0) -> list[str]:
    """The children of ``pid`` once it has reaped those that exited (or at the limit)."""
    deadline = time.monotonic() + limit_s
    while (found := Path(f"/proc/{pid}/task/{pid}/children").read_text().split()) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    return found


def test_the_servers_end_leaves_no_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = start(tmp_path / "root", False, monkeypatch)
    server = daemon_server()
    warm._servers.pop("daemon")
    server.stop()
    assert daemon.wait(30) == -signal.SIGKILL
    assert server.process.poll() is not None and not os.path.exists(server.directory)
    # the next daemon gets a new server
    daemon = start(tmp_path / "root", False, monkeypatch)
    assert daemon_server().process.pid != server.process.pid
    assert daemon.terminate() == 0


def test_what_could_start_differently_starts_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = [*warm_daemons.DAEMON_COMMAND, "--root", str(tmp_path)]
    assert isinstance(warm_daemons._plan(command, None), warm.Server)
    assert warm_daemons._plan([sys.executable, "-m", "substrat.daemon"], None) == "program"
    utf8 = "0" if os.environ.get("PYTHONUTF8") == "1" else "1"
    assert warm_daemons._plan(command, {**os.environ, "PYTHONUTF8": utf8}) == "environment"
    assert warm_daemons._plan(command, {**os.environ, "SUBSTRAT_X": "1"}) != "environment"
    assert warm_daemons._plan([*command, "x" * 100_000], None) == "command line"
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        assert warm_daemons._plan(command, None) == "identity"
        process = DaemonProcess(tmp_path / "ignored").start()  # a fresh one inherits SIG_IGN
        assert isinstance(process.proc, subprocess.Popen)
        process.kill()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    root = tmp_path / "root"
    with DaemonProcess(root, env={**os.environ, "PYTHONUTF8": utf8}) as daemon:
        assert isinstance(daemon.proc, subprocess.Popen)
    monkeypatch.setenv(warm.FRESH, "1")
    assert warm_daemons._plan(command, None) == warm.FRESH
    with DaemonProcess(root) as daemon:
        assert isinstance(daemon.proc, subprocess.Popen)


def test_a_dead_server_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = daemon_server()
    first = server.process.pid
    os.kill(first, signal.SIGKILL)
    server.process.wait(30)
    with start(tmp_path / "root", False, monkeypatch) as daemon:
        assert ping(tmp_path / "root") is not None
    assert daemon.proc is not None and daemon.proc.returncode == -signal.SIGKILL
    assert daemon_server().process.pid != first
