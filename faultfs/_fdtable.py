"""What the simulated calls hand out: descriptors, directory entries, stat results, errors."""

from __future__ import annotations

import itertools
import os
import stat as stat_mod
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from faultfs._model import Inode
    from faultfs._syscalls import Syscalls

# Simulated descriptors live far above any real one, so an int says which
# world it belongs to without a lookup in the common (real) case.
FAKE_FD_BASE = 1 << 30
fd_numbers = itertools.count(FAKE_FD_BASE)
"""The simulated descriptor numbers: ``next(fd_numbers)`` is one never handed out before."""


def next_fd() -> int:
    """A simulated descriptor number never handed out before in this process."""
    return next(fd_numbers)


# Which file system owns each simulated descriptor (the interceptor routes by it),
# held weakly: a program killed by a simulated crash never closes its descriptors (a
# killed process runs no cleanup), and a table holding their file systems kept every
# crashed model of a campaign alive (4 million objects and 1.3 GB per pytest worker
# after the crash fuzzer and the sweep; one full garbage collection then took 6 s).
# A file system's entries go when it does (see :func:`owner_ref`).
FD_OWNERS: dict[int, weakref.ref[Syscalls]] = {}


def fd_owner(fd: int) -> Syscalls | None:
    """The live file system that handed out ``fd``, or None."""
    ref = FD_OWNERS.get(fd)
    return None if ref is None else ref()


def owner_ref(owner: Syscalls, fds: dict[int, Handle]) -> weakref.ref[Syscalls]:
    """The reference ``FD_OWNERS`` holds for ``owner``, whose open descriptors are the
    keys of ``fds``: when ``owner`` is freed they leave the table, as a dead process's
    descriptors close. ``fds`` must not be ``owner`` itself or refer to it."""

    def forget(_: object) -> None:
        for fd in list(fds):
            FD_OWNERS.pop(fd, None)

    return weakref.ref(owner, forget)


ACCMODE = os.O_RDONLY | os.O_WRONLY | os.O_RDWR
_O_SYNC = getattr(os, "O_SYNC", 0)
_O_DSYNC = getattr(os, "O_DSYNC", 0)
_SYNC_BITS = _O_SYNC | _O_DSYNC
# Linux's O_SYNC includes the O_DSYNC bit (O_SYNC = __O_SYNC | O_DSYNC): the whole value
# names O_SYNC, the O_DSYNC bit alone names O_DSYNC.
_SYNC_KIND = {_O_SYNC: "fsync", _SYNC_BITS: "fsync", _O_DSYNC: "fdatasync"}


_STRERROR: dict[int, str] = {}
"""``os.strerror`` of each code met (a missing file is asked about at every start)."""


def oserror(code: int, path: str | None = None, path2: str | None = None) -> OSError:
    """An OSError of the right subclass (FileNotFoundError, ...) for ``code``."""
    text = _STRERROR.get(code)
    if text is None:
        text = _STRERROR[code] = os.strerror(code)
    if path2 is not None:
        return OSError(code, text, path, None, path2)
    if path is not None:
        return OSError(code, text, path)
    return OSError(code, text)


class Handle:
    """An open file description: inode, offset and access mode."""

    __slots__ = (
        "append",
        "fd",
        "flags",
        "ino",
        "is_dir",
        "lock",
        "path",
        "pos",
        "readable",
        "sync",
        "writable",
    )

    def __init__(self, fd: int, node: Inode, path: str, flags: int) -> None:
        acc = flags & ACCMODE
        self.fd = fd
        self.ino = node.ino
        self.is_dir = node.is_dir
        self.path = path
        self.pos = 0
        self.readable = acc in (os.O_RDONLY, os.O_RDWR)
        self.writable = acc in (os.O_WRONLY, os.O_RDWR)
        self.append = bool(flags & os.O_APPEND)
        self.lock = 0
        self.flags = flags  # fcntl F_GETFL reads the status flags back
        # O_SYNC: each write is followed by an fsync before it returns; O_DSYNC by an
        # fdatasync (POSIX synchronized I/O file / data integrity completion).
        self.sync = _SYNC_KIND.get(flags & _SYNC_BITS, "") if flags & _SYNC_BITS else ""


class FaultDirEntry:
    """What os.scandir yields for an entry of a simulated directory."""

    __slots__ = ("_fs", "_ino", "_is_dir", "name", "path")

    def __init__(self, fs: Syscalls, name: str, path: str, ino: int, is_dir: bool) -> None:
        self._fs = fs
        self.name = name
        self.path = path
        self._ino = ino
        self._is_dir = is_dir

    def inode(self) -> int:
        return self._ino

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return self._is_dir

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return not self._is_dir

    def is_symlink(self) -> bool:
        return False

    def is_junction(self) -> bool:
        return False

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        return self._fs.stat(self.path)

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"<FaultDirEntry {self.name!r}>"


class ScandirIterator:
    """A closable iterator over precomputed entries, like os.scandir's."""

    def __init__(self, entries: list[FaultDirEntry]) -> None:
        self._it: Iterator[FaultDirEntry] = iter(entries)

    def __iter__(self) -> ScandirIterator:
        return self

    def __next__(self) -> FaultDirEntry:
        return next(self._it)

    def __enter__(self) -> ScandirIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._it = iter(())


_UID = os.getuid()
_GID = os.getgid()


def _stat_tail() -> tuple[Any, ...] | None:
    """The fields after ``st_blocks`` (all None) when this platform's os.stat_result lists
    its named fields as Linux's does, so one is built from a flat tuple (about 4x faster
    than from a dict of them); None elsewhere."""
    named = tuple(os.stat_result((0,) * 10).__reduce__()[1][1])
    first = ("st_atime", "st_mtime", "st_ctime", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")
    if named[:8] != (*first, "st_blksize", "st_blocks"):
        return None
    return (None,) * (len(named) - 8)


_STAT_TAIL = _stat_tail()


def stat_result(node: Inode, dev: int) -> os.stat_result:
    """What ``stat`` says of ``node`` on the file system numbered ``dev``."""
    size = 4096 if node.is_dir else len(node.data)
    kind = stat_mod.S_IFDIR if node.is_dir else stat_mod.S_IFREG
    t_ns = node.mtime_ns
    t_s = t_ns / 1e9
    head = (kind | node.mode, node.ino, dev, node.nlink, _UID, _GID, size)
    whole_s = t_ns // 1_000_000_000
    if _STAT_TAIL is not None:
        fields: tuple[Any, ...] = (*head, whole_s, whole_s, whole_s, t_s, t_s, t_s, t_ns)
        return os.stat_result((*fields, t_ns, t_ns, 4096, (size + 511) // 512, *_STAT_TAIL))
    return os.stat_result(
        head + (whole_s,) * 3,
        {
            "st_atime": t_s,
            "st_mtime": t_s,
            "st_ctime": t_s,
            "st_atime_ns": t_ns,
            "st_mtime_ns": t_ns,
            "st_ctime_ns": t_ns,
            "st_blksize": 4096,
            "st_blocks": (size + 511) // 512,
        },
    )
