"""Driving the ``substrat`` command line as a real process, for tests."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from substrat.client import Client, stop_daemon
from substrat.eventlog import read_log
from substrat.events import TURN_COMPLETE, TURN_FAILED, TURN_START
from substrat.rpc import lock

SUBSTRAT = shutil.which("substrat") or ""


def cli_env(root: Path, columns: int = 200, **extra: str) -> dict[str, str]:
    env = {**os.environ, "SUBSTRAT_HOME": str(root), "COLUMNS": str(columns), **extra}
    env.pop("SUBSTRAT_NO_AUTOSTART", None)
    return env


def run(
    root: Path,
    *args: str,
    timeout_s: float = 60,
    stdin: str | None = None,
    columns: int = 200,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SUBSTRAT, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env if env is not None else cli_env(root, columns),
        input=stdin,
    )


def spawn(
    root: Path, *args: str, env: dict[str, str] | None = None, stdin: int | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [SUBSTRAT, *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env if env is not None else cli_env(root),
        # Tests interrupt it with SIGINT, as a user's Ctrl-C would; a test run started in
        # the background of a shell inherits SIGINT ignored, and so would the CLI.
        preexec_fn=_default_sigint,
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def kill_daemon(root: Path) -> None:
    info = lock.read_info(root)
    assert info is not None and info.pid is not None
    os.kill(info.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while lock.is_held(root):
        assert time.monotonic() < deadline
        time.sleep(0.02)


def wait_busy(root: Path, timeout_s: float = 30) -> None:
    """Until a turn runs: its ``turn.start`` is in its agent's log (written before the
    provider is called), so a SIGKILL from here on leaves a turn lost in flight; and its
    sender has been told that it started (with its id).

    The daemon queues the ``turn.status`` notice for the sender before it logs the
    turn's start, and its event loop runs what it queued first: so the answer to a
    ``ping`` sent once the start is logged comes after that notice was sent. Without
    the ping a kill could land between the two (seen under load: the client then
    could not name the turn it lost)."""
    deadline = time.monotonic() + timeout_s
    while not any(_open_turn(log) for log in root.glob("agents/*/events.jsonl")):
        assert time.monotonic() < deadline, f"no turn started in {timeout_s} s"
        time.sleep(0.01)
    with Client(root) as client:
        client.call("ping")


_TURN_EVENTS = frozenset({TURN_START, TURN_COMPLETE, TURN_FAILED})


def _open_turn(log: Path) -> bool:
    """Whether the log's last turn entry is a ``turn.start`` (the turn runs). The log is
    read as substrat reads it: a line still being written counts as not there yet."""
    turns = [e["event"] for e in read_log(log).entries if e["event"] in _TURN_EVENTS]
    return bool(turns) and turns[-1] == TURN_START


def wait_subscribed(root: Path, count: int, timeout_s: float = 60) -> None:
    """Until ``count`` clients (``watch``, ``log --follow``) are subscribed to the daemon's
    events: a sleep is not enough on a loaded machine, where a watcher that subscribes
    late misses the events it was started to see."""
    with Client(root) as client:
        deadline = time.monotonic() + timeout_s
        while client.call("daemon.status")["subscribers"] < count:
            assert time.monotonic() < deadline, f"fewer than {count} subscribers in {timeout_s} s"
            time.sleep(0.05)


def read_json_until(
    proc: subprocess.Popen[str], done: Callable[[Any], bool], timeout_s: float = 30
) -> list[Any]:
    """JSON lines from ``proc`` until ``done(line)`` is true (the process keeps running)."""
    lines = read_lines_until(
        proc, lambda line: line.startswith("{") and done(json.loads(line)), timeout_s
    )
    return [json.loads(line) for line in lines if line.startswith("{")]


def read_lines_until(
    proc: subprocess.Popen[str], done: Callable[[str], bool], timeout_s: float = 30
) -> list[str]:
    """The lines ``proc`` prints, through the first that is ``done`` (it keeps running)."""
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen.append(proc.stdout.readline())
        assert seen[-1], f"the process ended early: {proc.stderr.read() if proc.stderr else ''}"
        if done(seen[-1]):
            return seen
    raise AssertionError(f"timed out; saw {seen}")


def stop_or_kill(root: Path) -> None:
    """Leave no daemon behind: stop it, or SIGKILL it if it will not stop."""
    try:
        stop_daemon(root, timeout_s=10)
    except Exception:
        info = lock.read_info(root)
        if info is not None and info.pid is not None and lock.is_held(root):
            os.kill(info.pid, signal.SIGKILL)


def stop_all(roots: list[Path]) -> None:
    """Leave no daemon behind on any of ``roots`` (a test's list of the roots it ran
    commands on, emptied), whatever the test or the code under test did."""
    while roots:
        with contextlib.suppress(OSError):
            stop_or_kill(roots.pop())


def cli_root(tmp_path: Path) -> Iterator[Path]:
    """The body of a ``root`` fixture: a fresh root path, its daemon gone afterwards."""
    path = tmp_path / "root"
    yield path
    stop_or_kill(path)
