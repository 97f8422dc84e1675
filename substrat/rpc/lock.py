"""The root's lock: one daemon (or offline repair) per root at a time.

``<root>/daemon.lock`` is held with ``flock(LOCK_EX)`` for the daemon's whole
life; the kernel drops it when the process dies, however it dies. The file's
content names the holder and doubles as the clean-shutdown marker::

    {"pid": 4242, "started_at": "...", "state": "running", "socket": "...", "socket_ino": 77}

``socket_ino`` is written once the daemon has bound its socket (after recovery): a
client that finds no socket can then tell a daemon still recovering (no ``socket_ino``:
wait for it) from one whose socket was removed by hand (``socket_ino`` set, and the
socket gone or another file: it will never answer there).

A daemon rewrites ``state`` to ``"stopped"`` as the last step of a clean
shutdown. A new daemon that finds ``"running"`` in a file it could lock knows
the previous one died without shutting down (kill -9, OOM, power loss) and
says so to its subscribers. The file is rewritten in place (never renamed):
the lock belongs to the inode, and a rename would hand a second daemon a fresh,
unlocked inode.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

from substrat import persistence
from substrat.errors import RootLockedError
from substrat.rpc.transport import socket_path
from substrat.shellword import shell_word
from substrat.timestamps import utc_now_iso

LOCK_NAME = "daemon.lock"
MAX_LOCK_BYTES = 4096
_LONGEST_RECORD = {  # the running daemon's record (the longest) with an empty socket path
    "pid": 2**31 - 1,
    "started_at": "2026-01-01T00:00:00.000000+00:00",
    "state": "running",
    "socket": "",
    "socket_ino": 2**64 - 1,
    "provider_env": "0" * 16,
}
MAX_SOCKET_FIELD_CHARS = MAX_LOCK_BYTES - len(json.dumps(_LONGEST_RECORD, sort_keys=True)) - 1
"""Room left in a lock record for its socket path, as JSON escapes it (:func:`record_chars`);
``substrat.rootdir`` refuses a root whose path would not fit."""
LOCK_RETRY_S = 0.3
"""How long a starting daemon retries: a status probe may hold the lock for a moment."""


def record_chars(path: str | os.PathLike[str]) -> int:
    """How many characters ``path`` takes in a lock record (a non-ASCII one, or a byte
    that is not UTF-8, takes its JSON escape: 6 or 12)."""
    return len(json.dumps(os.fspath(path))) - 2


def lock_path(root: str | os.PathLike[str]) -> Path:
    return Path(root) / LOCK_NAME


# A NamedTuple, not a frozen dataclass: every CLI process and daemon defines it, and
# a frozen dataclass compiles six generated methods as it is defined (about 1 ms).
class LockInfo(NamedTuple):
    """What the lock file says about its (last) holder."""

    pid: int | None
    started_at: str | None
    state: str
    socket: str | None = None
    stopped_at: str | None = None
    socket_ino: int | None = None
    """The inode of the socket the daemon serves on; None while it recovers (not bound yet)."""
    recovered_by: str | None = None
    """Set when the root was recovered offline (``substrat recover``, ``fsck --repair``)
    after its daemon died: the next daemon has nothing left to recover."""
    provider_env: str | None = None
    """The fingerprint of the daemon's provider settings (substrat.provider_env)."""
    summary_unsaved: str | None = None
    """Why a clean stop could not write its start summary (a full disk, say)."""

    @classmethod
    def parse(cls, raw: bytes) -> LockInfo:
        """Parse lock-file bytes; an unreadable file reads as state ``"unknown"``."""
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return cls(None, None, "unknown")
        if not isinstance(body, dict):
            return cls(None, None, "unknown")
        return cls(
            pid=_opt_int(body.get("pid")),
            started_at=_opt_str(body.get("started_at")),
            state=str(body.get("state") or "unknown"),
            socket=_opt_str(body.get("socket")),
            stopped_at=_opt_str(body.get("stopped_at")),
            socket_ino=_opt_int(body.get("socket_ino")),
            recovered_by=_opt_str(body.get("recovered_by")),
            provider_env=_opt_str(body.get("provider_env")),
            summary_unsaved=_opt_str(body.get("summary_unsaved")),
        )

    def describe(self) -> str:
        if self.state == "running" and self.pid is not None:
            return f"daemon pid {self.pid} (started {self.started_at})"
        return "another substrat process (fsck, recover or a starting daemon)"


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_info(root: str | os.PathLike[str]) -> LockInfo | None:
    """The lock file's content, or None if there is none (or it is empty)."""
    try:
        with open(lock_path(root), "rb") as handle:
            raw = handle.read(MAX_LOCK_BYTES)
    except FileNotFoundError:
        return None
    return LockInfo.parse(raw) if raw else None


def read_only_note(root: str | os.PathLike[str]) -> str | None:
    """What to say when the root's file system refuses writes (None when it does not).
    An ext4 that hit an error (errors=remount-ro) refuses them while statvfs still says
    read-write: opening the lock file for writing (no byte written) asks the file system."""
    try:
        os.close(os.open(lock_path(root), os.O_WRONLY | os.O_CLOEXEC))
    except OSError as exc:
        if exc.errno == errno.EROFS:
            return "the root's file system is read-only (daemon.log too): remount it read-write"
    return None


def is_held(root: str | os.PathLike[str]) -> bool:
    """True if some process holds the root's lock right now (a live daemon, or fsck)."""
    try:
        fd = os.open(lock_path(root), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)  # closing drops our probe lock, if we got it
    return False


def socket_gone(root: str | os.PathLike[str]) -> LockInfo | None:
    """The lock record of a live daemon that serves (it bound its socket) but whose socket
    is gone or is another file now (removed by hand): it will never answer there. None
    when no daemon holds the root, when it is still recovering (not bound yet; wait for
    it), or when its socket is there."""
    info = read_info(root)
    if info is None or info.state != "running" or info.socket_ino is None:
        return None
    if info.pid is None or not running(info.pid):
        # a dead daemon's record, read while the next one starts (it holds the lock and
        # has not written its own yet): that one is recovering, not unreachable
        return None
    try:
        now: int | None = os.stat(socket_path(root)).st_ino
    except FileNotFoundError:
        now = None
    if now == info.socket_ino or not is_held(root):
        return None
    return info


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: a daemon killed under a parent that does
    not reap it, as a container's first process may not, stays one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return file.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:  # gone since, or no /proc (then taken as running)
        return not os.path.isdir("/proc/self")
    except (OSError, IndexError):
        return True


def flock_within(fd: int, timeout_s: float, *, poll_s: float = 0.01) -> bool:
    """``flock(LOCK_EX)`` on ``fd``, trying for up to ``timeout_s``: False if another holds
    it all that time. Other errors (a file system without flock) are raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


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


def cmdline(pid: int) -> list[str] | None:
    """The command line of process ``pid``; None when it is gone (or without /proc)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return [a.decode(errors="replace") for a in file.read().split(b"\0") if a]
    except OSError:
        return None


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
    pid = flock_holder(lock_path(root)) if pid is None else pid
    command = substrat_command(cmdline(pid) or []) if pid is not None else None
    work = next((_OFFLINE_WORK[w] for w in _OFFLINE_WORK if command and w in command), None)
    if work is None:
        return None
    return f"the root {root} is {work} by pid {pid} ({command}); retry when it ends"


def in_use(root: str | os.PathLike[str]) -> str:
    """Why the root's lock is not to be had: an offline command's work (when to retry),
    else the daemon or other process the lock file names (and how to stop it)."""
    offline = offline_work(Path(root))
    if offline is not None:
        return offline
    info = read_info(root) or LockInfo(None, None, "unknown")
    return (
        f"root {root} is in use by {info.describe()}; stop it with "
        f"`substrat daemon stop --root {shell_word(root)}` or use another root"
    )


class RootLock:
    """An exclusive hold on a root. Use :meth:`acquire`; release with :meth:`release`."""

    def __init__(self, root: Path, fd: int, previous: LockInfo | None) -> None:
        self.root = root
        self._fd: int | None = fd
        self.previous = previous
        """What the file said before we took it (None: no earlier daemon on this root)."""
        self.provider_env: str | None = None
        """Written into every record of this holder (the daemon sets it)."""

    @classmethod
    def acquire(cls, root: str | os.PathLike[str], *, retry_s: float = LOCK_RETRY_S) -> RootLock:
        """Take the lock or raise RootLockedError naming the holder."""
        path = lock_path(root)
        existed = path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if not existed:
                persistence.fsync_dir(path.parent)
            if not flock_within(fd, retry_s, poll_s=0.05):
                raise RootLockedError(in_use(root))
            raw = os.pread(fd, MAX_LOCK_BYTES, 0)
        except BaseException:
            os.close(fd)
            raise
        previous = LockInfo.parse(raw) if raw else None
        return cls(Path(root), fd, previous)

    @property
    def previous_shutdown(self) -> str:
        """``"clean"``, ``"unclean"`` (the last daemon died), ``"recovered"`` (it died, and
        the root was recovered offline since), or ``"none"`` (first start)."""
        if self.previous is None:
            return "none"
        if self.previous.state != "stopped":
            return "unclean"
        return "recovered" if self.previous.recovered_by else "clean"

    def mark_recovered(self, by: str) -> None:
        """After an offline recovery of a root whose daemon died: nothing is left to recover.

        The next daemon then says ``previous_shutdown: recovered`` instead of
        claiming an unclean shutdown it would only find already handled.
        """
        if self.previous_shutdown != "unclean":
            return
        previous = self.previous
        assert previous is not None
        self.provider_env = previous.provider_env  # the next autostart still compares with it
        self.write(
            pid=previous.pid,
            started_at=previous.started_at,
            state="stopped",
            stopped_at=utc_now_iso(),
            recovered_by=by,
        )

    def write(self, **fields: Any) -> None:
        """Replace the file's content in place and fsync it."""
        assert self._fd is not None, "lock already released"
        if self.provider_env is not None:
            fields.setdefault("provider_env", self.provider_env)
        data = json.dumps(fields, sort_keys=True).encode() + b"\n"
        assert len(data) <= MAX_LOCK_BYTES
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        persistence.write_all(self._fd, data)
        persistence.fsync_fd(self._fd, lock_path(self.root))

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None
