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
``recover``) is named by its pid and command, from ``/proc/locks``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from substrat.rootdir import DAEMON_LOG_NAME
from substrat.rpc import lock

_OFFLINE_WORK = {
    "compact": "being compacted",
    "fsck": "being checked",
    "recover": "being recovered",
}


def flock_holder(path: Path) -> int | None:
    """The pid of the process that holds a flock on ``path`` (a file or directory), read
    from /proc/locks; None when nobody holds it, or without /proc."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as file:
            text = file.read()
    except OSError:
        return None
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in text.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:1234 0 EOF" (a waiter's line has "->")
        parts = line.split()
        if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == want and parts[4].isdigit():
            return int(parts[4])
    return None


def root_holder(root: Path) -> int | None:
    """The pid of the process that holds ``root`` open (:mod:`substrat.root_hold`: a flock
    on the directory, which a daemon keeps when its ``daemon.lock`` or socket is removed by
    hand); None when nobody holds it, or without /proc."""
    return flock_holder(root)


def _cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return [a.decode(errors="replace") for a in file.read().split(b"\0") if a]
    except OSError:
        return None


def unreachable_daemon(root: Path) -> int | None:
    """The pid of a substrat daemon that holds ``root`` though its lock file says nothing of
    it (the file removed by hand); None if there is none (or another kind of process, an
    application or fsck, holds the root)."""
    pid = root_holder(root)
    if pid is None or pid == os.getpid():
        return None
    args = _cmdline(pid)
    return pid if args is not None and "substrat.daemon" in args else None


def substrat_command(args: list[str]) -> str | None:
    """``substrat compact`` (``fsck --repair``, ...) for a substrat CLI's argv; None for
    any other program."""
    for i, arg in enumerate(args):
        if os.path.basename(arg) == "substrat" or arg == "substrat.cli":
            words = [a for a in args[i + 1 :] if a in _OFFLINE_WORK or a == "--repair"]
            return " ".join(["substrat", *words[:2]])
    return None


def offline_work(root: Path, pid: int | None = None) -> str | None:
    """``the root R is being compacted by pid N (substrat compact); retry when it ends``
    when an offline substrat command holds the root's lock (``pid``: its holder, if
    known); None for anything else (a daemon, another program, nobody)."""
    pid = flock_holder(lock.lock_path(root)) if pid is None else pid
    command = substrat_command(_cmdline(pid) or []) if pid is not None else None
    work = next((_OFFLINE_WORK[w] for w in _OFFLINE_WORK if command and w in command), None)
    if work is None:
        return None
    return f"the root {root} is {work} by pid {pid} ({command}); retry when it ends"


def busy_message(root: Path, waited_s: float) -> str:
    """Why a start waited ``waited_s`` for the root in vain: who holds it and what to do."""
    pid = flock_holder(lock.lock_path(root))
    if pid is not None:
        args = _cmdline(pid) or []
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


@contextlib.contextmanager
def start_lock(root: Path, timeout_s: float) -> Iterator[None]:
    """Hold the root's start lock (module docstring) for the block; waits up to
    ``timeout_s`` for another start. A log that cannot be opened (the start reports
    that itself) or locked (a file system without flock) leaves the block unlocked:
    a start that loses the race then finds the winner afterwards (client.start_daemon)."""
    try:
        fd = os.open(_lock_name(root), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        yield
        return
    try:
        # not got (another start stuck that long, or no flock here): go on unlocked; its
        # daemon, if any, is found afterwards
        with contextlib.suppress(OSError):
            lock.flock_within(fd, timeout_s)
        yield
    finally:
        os.close(fd)  # drops the lock
