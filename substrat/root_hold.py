"""One process at a time has a root open.

Two processes with an orchestrator on one root each recover it and then
append to the same logs with their own counters: they hand out the same turn
ids and ``seq`` numbers, each declares the other's turn in flight lost, and a
later repair of the duplicate lines removes acknowledged turns (an outside
review did this with two applications, and with an application beside the
root's daemon). So :meth:`Orchestrator.open
<substrat.orchestrator.Orchestrator.open>` takes this hold first and
:meth:`~substrat.orchestrator.Orchestrator.close` gives it back.

The hold is ``flock(LOCK_EX)`` on the root directory itself, not on a file in
it: taking it writes nothing (no file, no crash boundary), and the kernel drops
it when the process dies, however it dies. The daemon serves its root through
an orchestrator, so it holds it too (beside ``daemon.lock``, whose content is
its clean-shutdown marker, see :mod:`substrat.rpc.lock`); so do ``fsck``,
``recover`` and ``compact``.

Within one process the orchestrators of a root share the process's hold (one
descriptor, counted; the last to give it back closes it). That is what the
in-process crash tests need: they drop an orchestrator as a kill would and
open the root again in the same process, and a ``flock`` taken on a second
descriptor would conflict with the first. It also means two orchestrators
opened on one root by one program are not told apart: keep one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from substrat.errors import RootLockedError
from substrat.rpc import lock


@dataclass
class _Held:
    fd: int
    users: int = 0


_HELD: dict[tuple[int, int], _Held] = {}
"""This process's holds, by the root directory's (device, inode)."""
_GUARD = threading.Lock()
log = logging.getLogger(__name__)


class RootHold:
    """One orchestrator's share of this process's hold on its root (see the module docstring)."""

    def __init__(self, root: Path, key: tuple[int, int]) -> None:
        self.root = root
        self._key: tuple[int, int] | None = key

    @classmethod
    def take(cls, root: Path) -> RootHold:
        """Hold ``root`` (an existing directory) or raise RootLockedError saying who has it."""
        info = os.stat(root)
        key = (info.st_dev, info.st_ino)
        with _GUARD:
            held = _HELD.get(key)
            if held is None:
                held = _HELD[key] = _Held(_lock(root))
            held.users += 1
        return cls(root, key)

    def release(self) -> None:
        """Give this share back; the process's last share drops the lock. Idempotent."""
        key, self._key = self._key, None
        if key is None:
            return
        with _GUARD:
            held = _HELD[key]
            held.users -= 1
            assert held.users >= 0
            if held.users:
                return
            del _HELD[key]
        with contextlib.suppress(OSError):  # a simulated disk may be gone by now
            os.close(held.fd)  # closing the descriptor drops the flock

    @property
    def held(self) -> bool:
        return self._key is not None


_NO_DIRECTORY_LOCKS = frozenset(
    {errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS}
)
"""What a file system that cannot ``flock`` a directory answers (NFS emulates flock with
byte-range locks, which an exclusive lock needs a descriptor open for writing for)."""


def _lock(root: Path) -> int:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in _NO_DIRECTORY_LOCKS:
            # Refusing every open here would make the root unusable; serve it as before
            # this hold existed, and say once that nothing keeps a second process off it.
            log.warning(
                "%s: this file system cannot lock a directory (%s): nothing keeps a second "
                "process from opening this root; keep one process on it",
                root,
                os.strerror(exc.errno or 0),
            )
            return fd
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        raise RootLockedError(_in_use(root)) from None
    return fd


def _in_use(root: Path) -> str:
    info = lock.read_info(root) if lock.is_held(root) else None
    if info is not None and info.state == "running" and info.pid is not None:
        return (
            f"root {root} is open in daemon pid {info.pid}: reach its agents through the "
            f"daemon (the substrat CLI, or substrat.client.Client), or stop it with "
            f"`substrat daemon stop --root {root}` before opening the root here"
        )
    return (
        f"root {root} is already open in another process (an application using substrat's "
        "Python API, fsck, recover or compact); close it there first (Orchestrator.close), "
        "or use another root"
    )
