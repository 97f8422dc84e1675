"""Private working directories in the temp directory that a killed daemon does not leak.

A provider that talks to a child process through files or a socket (the
``claude-code`` CLI's MCP config and tool socket) needs a short, private path:
a Unix socket's path must fit ``sun_path`` (108 bytes), which a root deep in a
user's tree may not. So the directory lives in the system's temp directory,
and a daemon stopped by ``kill -9``, the OOM killer or a power cut never
removes it. Each one therefore carries a lock file its owner holds with
``flock`` for as long as the directory is in use: the kernel drops that lock
when the owner dies, however it dies, so any later process of the same user
may remove the directory. A live owner's directory is never touched, even
from another PID namespace sharing the temp directory (the lock is on the
file, not on a PID).

A directory is locked before it gets its final name (it is made under a
staging prefix, locked, then renamed), so no sweeper sees an unlocked
directory that is about to be used.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path

LOCK_NAME = ".owner.lock"
STAGING_MARK = ".new-"
MAX_SWEPT_PER_CALL = 1000
"""A bound on one sweep's work, so a temp directory full of leftovers costs a start little."""

_swept: set[tuple[str, str]] = set()
"""(directory, prefix) pairs this process has swept: once per process is enough."""


class ScratchDir:
    """A directory ``path`` in the temp directory, locked by this process until :meth:`remove`."""

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self._lock_fd: int | None = lock_fd

    def remove(self) -> None:
        """Delete the directory, then let go of its lock; calling it again does nothing."""
        if self._lock_fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock_fd)
        self._lock_fd = None


def make_scratch(prefix: str, base: str | None = None) -> ScratchDir:
    """A new private (0700) directory named ``prefix...`` under ``base`` (the temp directory).

    Before the first one of a process, removes what dead owners left under the
    same prefix (see :func:`sweep_dead`).
    """
    assert prefix and os.sep not in prefix and STAGING_MARK not in prefix, prefix
    base = tempfile.gettempdir() if base is None else base
    if (base, prefix) not in _swept:
        _swept.add((base, prefix))
        sweep_dead(prefix, base)
    staging = Path(tempfile.mkdtemp(prefix=prefix + STAGING_MARK, dir=base))
    try:
        fd = os.open(staging / LOCK_NAME, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
        final = staging.with_name(prefix + staging.name[len(prefix + STAGING_MARK) :])
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(fd)
        raise
    return ScratchDir(final, fd)


def sweep_dead(prefix: str, base: str) -> list[Path]:
    """Remove this user's ``prefix...`` directories under ``base`` whose owner is gone.

    A directory is removed only if it is a real directory (not a symlink) owned
    by this user, holds a lock file, and that lock can be taken: its owner
    died. A directory without the lock file (made by an older version, or by
    something else using the prefix) is left alone, as is a staging directory
    (its owner may be between making and locking it). Returns what was removed.
    """
    removed: list[Path] = []
    uid = os.getuid()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed  # nothing to sweep where nothing can be listed
    for entry in entries:
        if len(removed) >= MAX_SWEPT_PER_CALL:
            break
        name = entry.name
        if not name.startswith(prefix) or name.startswith(prefix + STAGING_MARK):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
            continue
        if _owner_is_gone(Path(entry.path)):
            removed.append(Path(entry.path))
    return removed


def _owner_is_gone(path: Path) -> bool:
    """Take the directory's lock; if that works its owner is dead: remove it under the lock."""
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # alive
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
