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

Each hold is a descriptor of its own, so a second open of a root in the same
process conflicts with the first exactly as another process's would (``flock``
locks belong to the open file description): two orchestrators in one program
hand out the same ids just as two processes do. Only a caller that passes its
own hold on (the daemon and ``fsck --repair`` to the orchestrator they open)
shares it. The in-process crash tests drop an orchestrator as a kill would
(:func:`oracle.kill.abandon`), which closes its descriptors (the hold's too) as
the kernel does for a dead process, and then open the root again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from pathlib import Path

from substrat.errors import RootLockedError
from substrat.rpc import lock
from substrat.shellword import shell_word

log = logging.getLogger(__name__)


class RootHold:
    """This process's hold on one root (see the module docstring)."""

    def __init__(self, root: Path, fd: int) -> None:
        self.root = root
        self._fd: int | None = fd

    @classmethod
    def take(cls, root: Path) -> RootHold:
        """Hold ``root`` (an existing directory) or raise RootLockedError saying who has it."""
        return cls(root, _lock(root))

    def release(self) -> None:
        """Give the hold back (closing the descriptor drops the flock). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):  # a simulated disk may be gone by now
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None


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
    holder = lock.flock_holder(root)  # of the directory (this hold)
    offline = lock.offline_work(root, holder) if holder is not None else None
    if offline is not None:  # compact, fsck --repair, recover: when to retry
        return offline
    info = lock.read_info(root) if lock.is_held(root) else None
    if info is not None and info.state == "running" and info.pid is not None:
        return (
            f"root {root} is open in daemon pid {info.pid}: reach its agents through the "
            f"daemon (the substrat CLI, or substrat.client.Client), or stop it with "
            f"`substrat daemon stop --root {shell_word(root)}` before opening the root here"
        )
    if holder == os.getpid():  # (a dropped one was collected first: substrat.opening)
        return (
            f"root {root} is already open in another Orchestrator of this process, which is "
            "still in use; close that one first (await orch.close(), or open it with "
            "`async with Orchestrator.open(root) as orch:`, which closes it when the block "
            "ends), or use another root"
        )
    return (
        f"root {root} is already open: in another process (an application using substrat's "
        "Python API, fsck, recover or compact) or in another Orchestrator of this one; close "
        "it there first (Orchestrator.close), or use another root"
    )
