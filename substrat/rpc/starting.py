"""Who holds a root, and the start lock that makes concurrent starts converge.

Any command that needs the daemon starts it on demand, so after a crash (or a
clean stop) many commands may find no daemon at once. Each spawning its own
daemon let one win the root's lock and the others exit 3, their commands
telling the user to stop the very daemon the rest were using (outside review
s19f, finding 1). A client therefore takes the *start lock* before it spawns a
daemon: ``flock(LOCK_EX)`` on a descriptor of its own for ``<root>/daemon.log``,
the file every start opens anyway (no new file in the root, nothing written).
The daemon's output goes through another open of that file, so the daemon never
holds the lock. The next client in line then finds the winner's daemon
answering and uses it. ``daemon restart`` holds the lock across its stop and
its start, so the daemon that runs afterwards is its own (with its shell's
environment), not one a command started in between.

A root held by something else (an offline ``compact``, ``fsck --repair`` or
``recover``) is named by its pid and command, from ``/proc/locks``
(:func:`substrat.rpc.lock.offline_work`).

A daemon that is stopping (``daemon stop``, SIGTERM: it waits up to its grace for
the turns it runs) closes its socket to new connections at once, but a command
that connected just before may see its request refused (``-32008`` whose data says
``applied: false``). Such a request never ran, so the client waits for that daemon
to exit (:func:`wait_for_stop`, under the start lock), starts the next one and
sends it again there; a request the stop cut short carries no ``applied`` and is
never sent twice.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from substrat.errors import (
    DaemonDiedError,
    DaemonError,
    DaemonUnreachableError,
    RootLockedError,
    RootPermissionError,
    RpcError,
)
from substrat.rootdir import DAEMON_LOG_NAME, foreign_daemon
from substrat.rpc import lock, protocol
from substrat.rpc.lock import cmdline, flock_holder, offline_work
from substrat.rpc.transport import socket_path
from substrat.shellword import shell_word

STOP_MARGIN_S = 30.0
"""How long past its grace a stopping daemon may take to exit (its turns cancelled, its
sessions suspended, its connections closed) before a command that waits for it gives up."""
START_LOCK_EXTRA_S = 60.0
"""How long past that a command waits for the start lock (a ``daemon restart`` holds it
across its stop and the next daemon's start, recovery included)."""

_POLL_S = 0.01


def root_holder(root: Path) -> int | None:
    """The pid of the process that holds ``root`` open (:mod:`substrat.root_hold`: a flock
    on the directory, which a daemon keeps when its ``daemon.lock`` or socket is removed by
    hand); None when nobody holds it, or without /proc."""
    return flock_holder(root)


def refuse_held_root(root: str | os.PathLike[str]) -> Path:
    """Raise RootLockedError, naming the holder and what to do, when a process other than
    a substrat daemon holds ``root`` (an application's Orchestrator, fsck, recover,
    compact). A start calls this before it writes anything into the root (the marker,
    the start lock's ``daemon.log``): the daemon would be refused the root, and what it
    left there would be litter in a root that is not its to touch (outside review s21f,
    F8). A daemon's hold, or offline work's that holds the lock file too, passes (the
    start waits for it, or uses the daemon), and so does a missing directory (a new root:
    nobody can hold it). Returns the root's absolute path."""
    root = Path(root).expanduser().absolute()
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return root  # missing, or not a directory: preparing the root says what is wrong
    try:
        if lock.flock_within(fd, 0):
            return root  # nobody holds it (closing the descriptor lets go at once)
    except OSError:
        return root  # a file system without directory locks: nothing to tell from here
    finally:
        os.close(fd)
    pid = root_holder(root)
    args = cmdline(pid) if pid is not None else None
    if args is not None and _a_daemon(args):
        return root  # starting, serving or stopping: waited for, or used
    if lock.is_held(root):
        return root  # offline work holding the lock file too (without /proc, a daemon)
    if pid is not None and pid != os.getpid():
        offline = offline_work(root, pid)  # fsck without --repair holds no lock file
        if offline is not None:
            raise RootLockedError(f"{offline}; nothing was written to it")
    who = f"pid {pid}" if pid is not None else "a process"
    if args:
        who += f" ({' '.join(args)[:80]})"
    raise RootLockedError(
        f"root {root} is already open: in another process, {who}, not a substrat daemon "
        "(an application using substrat's Python API, or fsck, recover or compact), so no "
        "daemon can serve it now and nothing was written to it. Close it there first "
        "(Orchestrator.close, or end that program), then run the command again; or use "
        "another root"
    )


def _a_daemon(args: list[str]) -> bool:
    """Whether a process that holds a root directory is a substrat daemon, from its argv:
    ``python -m substrat.daemon``, or ``substrat daemon start --foreground`` (no other
    ``substrat daemon`` command holds a root)."""
    if "substrat.daemon" in args:
        return True
    cli = next((i for i, a in enumerate(args) if os.path.basename(a) == "substrat"), None)
    return cli is not None and "daemon" in args[cli + 1 :]


def unreachable_daemon(root: Path) -> int | None:
    """The pid of a substrat daemon that holds ``root`` though its lock file says nothing of
    it (the file removed by hand); None if there is none (or another kind of process, an
    application or fsck, holds the root)."""
    pid = root_holder(root)
    if pid is None or pid == os.getpid():
        return None
    args = cmdline(pid)
    return pid if args is not None and "substrat.daemon" in args else None


def busy_message(root: Path, waited_s: float) -> str:
    """Why a start waited ``waited_s`` for the root in vain: who holds it and what to do."""
    pid = flock_holder(lock.lock_path(root))
    if pid is not None:
        args = cmdline(pid) or []
        if "substrat.daemon" in args:
            return (
                f"daemon pid {pid} holds {root} but has not answered for {waited_s:g}s (still "
                f"recovering?); see {root / DAEMON_LOG_NAME}, and retry when it serves"
            )
        offline = offline_work(root, pid)
        if offline is not None:
            return offline
        what = f" ({' '.join(args)[:80]})" if args else ""
        return f"the root {root} is held by pid {pid}{what}; retry when it lets go"
    info = lock.read_info(root)
    held_by = info.describe() if info is not None else "another process"
    return f"the root {root} is in use by {held_by}; retry when it lets go"


def _lock_name(root: Path) -> Path:
    return root / DAEMON_LOG_NAME


def take_start_lock(
    root: Path, timeout_s: float, on_wait: Callable[[int | None], None] | None = None
) -> int | None:
    """The root's start lock (module docstring), waited for up to ``timeout_s``: the
    descriptor that holds it (closing it lets go), or None when the log cannot be opened
    (the start reports that itself). ``on_wait(pid)`` is called first when another start
    (``pid``, if known) holds it. Not got in time (another start stuck that long) or
    not lockable (a file system without flock): the descriptor is handed back all the
    same, unlocked; a start that loses the race finds the winner afterwards."""
    refuse_held_root(root)  # before the log's open creates it
    name = _lock_name(root)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        if not lock.flock_within(fd, 0):
            if on_wait is not None:
                on_wait(flock_holder(name))
            lock.flock_within(fd, timeout_s)
    return fd


@contextlib.contextmanager
def start_lock(root: Path, timeout_s: float) -> Iterator[None]:
    """Hold the root's start lock for the block (:func:`take_start_lock`)."""
    fd = take_start_lock(root, timeout_s)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # drops the lock


def stopping_refusal(exc: RpcError) -> dict[str, Any] | None:
    """The data of a stopping daemon's refusal of a request it never ran (module
    docstring); None for any other error, a request the stop cut short among them."""
    data = exc.data
    if exc.code != protocol.SHUTTING_DOWN or not isinstance(data, dict):
        return None
    return data if data.get("applied") is False else None


def stop_limit(refusal: dict[str, Any], default_grace_s: float) -> float:
    """How long to wait for the daemon that sent ``refusal`` to exit: its grace (or
    ``default_grace_s`` when it does not say) and :data:`STOP_MARGIN_S`."""
    grace = refusal.get("grace_s")
    if not isinstance(grace, (int, float)) or isinstance(grace, bool) or grace < 0:
        grace = default_grace_s
    return float(grace) + STOP_MARGIN_S


def _refused_pid(refusal: dict[str, Any]) -> int | None:
    pid = refusal.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else None


def refused_while_stopping(root: Path, method: str, refusal: dict[str, Any]) -> str:
    """What a command that may not start a daemon (``--no-autostart``) says when a
    stopping daemon refused its request."""
    pid = _refused_pid(refusal)
    return (
        f"the daemon{f' (pid {pid})' if pid else ''} for {root} is stopping: it refused "
        f"{method}, which was not applied; run the command again once a daemon serves "
        f"(`substrat daemon start --root {shell_word(root)}`)"
    )


def restart_after_stop(
    root: Path,
    method: str,
    refusal: dict[str, Any],
    default_grace_s: float,
    ping: Callable[[Path], dict[str, Any] | None],
    start: Callable[[bool], None],
) -> None:
    """After a stopping daemon refused ``method`` (never run): wait for it to exit, then
    ``start(True)`` the next daemon under the start lock, as a command does that finds
    none; a ``daemon restart`` that holds the lock meanwhile starts it instead."""
    limit = stop_limit(refusal, default_grace_s)
    with start_lock(root, limit + START_LOCK_EXTRA_S):
        answer = ping(root)
        if answer is None or answer.get("stopping"):
            wait_for_stop(root, _refused_pid(refusal), method, limit)
            start(True)


def wait_for_stop(root: Path, pid: int | None, method: str, limit_s: float) -> None:
    """Wait up to ``limit_s`` for the stopping daemon ``pid`` to let go of ``root``; a
    DaemonError saying what to do when it does not."""
    path = lock.lock_path(root)
    if wait_until(lambda: not lock.is_held(root) or flock_holder(path) not in (pid, None), limit_s):
        return
    who = f"daemon pid {pid}" if pid is not None else "the daemon"
    raise DaemonError(
        f"the {who} for {root} has been stopping for over {limit_s:g}s; it refused {method}, "
        f"which was not applied. See {root / DAEMON_LOG_NAME}; once it has exited "
        f"(`substrat daemon stop --root {shell_word(root)}` waits for it) run the command again"
    )


def check_socket(root: Path) -> None:
    """Raise DaemonUnreachableError at once when a live daemon serves on ``root`` but its
    socket was removed by hand (its lock file too, maybe): it will never answer, and
    waiting for it (as for a daemon still recovering) would only end at the time limit."""
    info = lock.socket_gone(root)
    pid = info.pid if info is not None else None
    also = ""
    if info is None and not lock.lock_path(root).exists():
        pid, also = unreachable_daemon(root), f" (and its lock file {lock.LOCK_NAME})"
    if pid is not None:
        raise DaemonUnreachableError(
            f"daemon pid {pid} is running but its socket {socket_path(root)} is gone{also}; "
            f"`substrat daemon restart --root {shell_word(root)}`"
        )


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Whether ``condition`` came true within ``timeout_s`` (looked at every ``_POLL_S``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def terminate(pid: int) -> None:
    """SIGTERM to ``pid`` (a daemon's clean stop), if it still runs."""
    import signal  # (here: a command that only sends a request never needs it)

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def exited(pid: int, deadline: float, root: Path) -> int:
    """``pid`` once that process is gone (by ``deadline``, monotonic). A daemon gives the
    root back (its lock, its hold) before its interpreter has finished exiting: "stopped"
    said then was true of the root, not of the process, and a script that checked the pid
    right after saw it still running."""
    if wait_until(lambda: not lock.running(pid), max(0.0, deadline - time.monotonic())):
        return pid
    raise not_stopped(pid, root, "gave the root back but has not exited")


def not_stopped(pid: int | None, root: Path, state: str) -> DaemonError:
    """The error of a stop that waited in vain: what to look at, and what to do."""
    return DaemonError(
        f"the daemon (pid {pid}) {state}; see {root / DAEMON_LOG_NAME}, or kill it "
        f"(`kill -9 {pid}`; nothing acknowledged is lost)"
    )


def log_tail(path: Path, since: int = 0, lines: int = 20) -> str:
    """The last ``lines`` lines of ``path`` written from offset ``since`` on."""
    try:
        with open(path, "rb") as handle:
            handle.seek(since)
            text = handle.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def died_error(
    root: Path, sock: Path, request: str | None, *, stopping: bool
) -> DaemonDiedError | RootPermissionError:
    """What to tell a client whose daemon closed the connection while it waited.

    ``request``: the method it waited for (None: it only read the daemon's events);
    ``stopping``: the daemon had announced a clean shutdown on that connection.
    """
    refused = foreign_daemon(sock)
    if refused is not None:
        return refused
    info = lock.read_info(root)
    pid = f" (pid {info.pid})" if info is not None and info.pid is not None else ""
    # Give the kernel a moment to release a dead daemon's lock.
    gone = wait_until(lambda: not lock.is_held(root), 0.5)
    after = lock.read_info(root)
    if stopping or (gone and after is not None and after.state == "stopped"):
        cause = f"the daemon{pid} shut down"
    elif gone:
        cause = f"the daemon{pid} died (crashed or was killed)"
    else:
        cause = f"the daemon{pid} closed the connection"
    if request is None:
        return DaemonDiedError(
            f"{cause}; `substrat daemon start --root {shell_word(root)}` recovers"
        )
    return DaemonDiedError(
        f"{cause} before answering {request}; the request may or may not have been applied. "
        f"Run `substrat daemon start --root {shell_word(root)}` to recover, then check with "
        "`substrat agent list` / `substrat log`."
    )
