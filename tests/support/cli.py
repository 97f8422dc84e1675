"""Driving the ``substrat`` command line as a real process, for tests."""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import os
import select
import signal
import subprocess
import sys
import sysconfig
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from substrat.client import Client, stop_daemon
from substrat.eventlog import read_log
from substrat.events import TURN_COMPLETE, TURN_FAILED, TURN_START
from substrat.rpc import lock
from tests.support import warm


def installed_script(name: str = "substrat") -> str:
    """The console script ``name`` of the Python running the tests ("" if it has none).

    Looked up in this interpreter's scripts directories, not on PATH: run as
    ``venv/bin/python -m pytest`` without the venv on PATH, the first ``substrat``
    on PATH belonged to another Python (a pyenv shim to the image's Python, whose
    editable install was another checkout), and the CLI tests drove that program.
    """
    for scheme in (None, f"{os.name}_user"):
        scripts = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        path = os.path.join(scripts, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return ""


SUBSTRAT = installed_script()
NOT_INSTALLED = (
    f"this Python ({sys.executable}) has no substrat console script: "
    "`pip install -e .` with it, then run the tests again"
)


def path_with_substrat(path: str | None = None) -> str:
    """PATH for a shell that runs ``substrat ...`` lines: :data:`SUBSTRAT`'s directory first."""
    rest = os.environ.get("PATH", os.defpath) if path is None else path
    return os.pathsep.join([os.path.dirname(SUBSTRAT), rest]) if SUBSTRAT else rest


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
    return warm.run(
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
        proc,
        lambda line: line.startswith("{") and done(json.loads(line)),
        timeout_s,
        awaited=f"a JSON {_awaited(done)}",
    )
    return [json.loads(line) for line in lines if line.startswith("{")]


def read_lines_until(
    proc: subprocess.Popen[str],
    done: Callable[[str], bool],
    timeout_s: float = 30,
    awaited: str | None = None,
) -> list[str]:
    """The lines ``proc`` prints, through the first that is ``done`` (it keeps running).

    Waits at most ``timeout_s`` in all: it reads the pipe only once ``select`` says a
    read will not block (a bare ``readline`` waits for a process that never prints
    until pytest's own timeout). It reads the pipe's bytes itself, not through
    ``proc.stdout``'s buffer, which ``select`` cannot see; what came after the ``done``
    line waits for the next call here (as ``proc.stdout``'s buffer held it before).
    ``awaited`` says what ``done`` waits for, in a failure's message (by default, its
    source)."""
    assert isinstance(proc.stdout, io.TextIOWrapper)  # (text=True)
    awaited = awaited or f"a {_awaited(done)}"
    fd = proc.stdout.fileno()
    pending = _pending.setdefault(proc, bytearray())
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        end = pending.find(b"\n")
        if end >= 0:
            raw = bytes(pending[: end + 1])
            del pending[: end + 1]
            seen.append(raw.decode(proc.stdout.encoding, proc.stdout.errors or "strict"))
            if done(seen[-1]):
                return seen
            continue
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        if not ready:
            raise AssertionError(
                f"timed out after {timeout_s} s awaiting {awaited}; the lines seen so far: {seen}"
            )
        chunk = os.read(fd, 65536)
        if not chunk:  # the process closed its output: the line never comes
            if pending:  # its last line, with no newline
                seen.append(bytes(pending).decode(proc.stdout.encoding, "replace"))
                pending.clear()
                if done(seen[-1]):
                    return seen
            err = _stderr_by(proc, max(deadline, time.monotonic() + 1))
            raise AssertionError(
                f"the process ended early, before {awaited}; "
                f"the lines seen so far: {seen}; its stderr: {err}"
            )
        pending += chunk


def _stderr_by(proc: subprocess.Popen[str], deadline: float) -> str:
    """What ``proc`` printed on stderr, read until it closes it or ``deadline`` (a
    ``time.monotonic`` value): a process that closed stdout may keep running with stderr
    open, and a plain ``read`` would wait for it as long as it runs."""
    if proc.stderr is None:
        return ""
    fd = proc.stderr.fileno()
    got = bytearray()
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            got += b" [stderr still open: the process is still running]"
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        got += chunk
    return got.decode(getattr(proc.stderr, "encoding", None) or "utf-8", "replace")


# Bytes a process printed after the line a read_lines_until call waited for, by process.
_pending: weakref.WeakKeyDictionary[subprocess.Popen[str], bytearray] = weakref.WeakKeyDictionary()


def _awaited(done: Callable[..., bool]) -> str:
    """The awaited line, as the test's source says it (its predicate, where it is)."""
    code = getattr(done, "__code__", None)
    where = f" ({Path(code.co_filename).name}:{code.co_firstlineno})" if code else ""
    try:
        source = " ".join(inspect.getsource(done).split())
    except (OSError, TypeError):
        source = repr(done)
    return f"line for which {source}{where} holds"


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


def cli_roots() -> Iterator[list[Path]]:
    """The body of a ``roots`` fixture: the list a test adds the roots it ran commands on
    to; their daemons are gone afterwards."""
    paths: list[Path] = []
    yield paths
    stop_all(paths)


def cli_root(tmp_path: Path) -> Iterator[Path]:
    """The body of a ``root`` fixture: a fresh root path, its daemon gone afterwards."""
    path = tmp_path / "root"
    yield path
    stop_or_kill(path)
