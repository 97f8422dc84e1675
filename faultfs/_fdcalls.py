"""The rest of os's descriptor calls on simulated descriptors: modelled, or refused by name.

Without these a simulated descriptor handed to ``os.writev``, ``os.dup`` or
``fcntl.fcntl`` reached the real kernel and failed with a bare ``EBADF``,
which a library may swallow and fall back from (then the fallback is what
gets tested), or drop a write unseen. The calls the model can answer exactly
are modelled (``writev``/``pwritev`` as one write, ``readv``/``preadv``,
``dup``, the descriptor and status flags, ``posix_fadvise`` as the hint it
is, ``posix_fallocate`` as the size it sets, ``fstatvfs``); ``os.sync`` makes
every active model durable as Linux's sync(2) does (not under the lazyfs
profile: see ``Profile.sync_persists``). The others stop with
:class:`EscapeError` naming the call, what faultfs does not model and what
to do; it is recorded on the FaultFS, so explore and the fixtures fail even
when the code swallowed it.

Every replacement looks the descriptor up first and hands a real one to the
original at once: real descriptors pay one dictionary miss.
"""

from __future__ import annotations

import errno
import fcntl
import mmap  # loaded now, so faultfs's check on mmap.mmap is in place for a later import
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from faultfs._fdtable import ACCMODE, FAKE_FD_BASE, FD_OWNERS, next_fd, oserror
from faultfs.errors import EscapeError

if TYPE_CHECKING:
    from faultfs._fs import FaultFS
    from faultfs._syscalls import Syscalls

del mmap  # imported for its side effect only

Router = Callable[[Any], "tuple[FaultFS, str] | None"]

# Python's os.open and os.dup hand out non-inheritable descriptors (FD_CLOEXEC set).
_inheritable: set[int] = set()  # simulated descriptors made inheritable (numbers never reused)
_nonblocking: set[int] = set()
_kernel_flags: list[int] = []  # status bits the kernel adds to F_GETFL (O_LARGEFILE)
_real_statvfs = os.statvfs
_real_open = os.open
_real_close = os.close
_real_fcntl = fcntl.fcntl
_SETFL_BITS = os.O_APPEND | os.O_NONBLOCK | getattr(os, "O_DIRECT", 0) | getattr(os, "O_NOATIME", 0)


def _owner(fd: Any) -> Syscalls | None:
    if type(fd) is int and fd >= FAKE_FD_BASE:
        ref = FD_OWNERS.get(fd)
        return None if ref is None else ref()
    return None


def _fd(obj: Any) -> Any:
    return obj if isinstance(obj, int) or not hasattr(obj, "fileno") else obj.fileno()


def refuse(fs: Syscalls, call: str, why: str, instead: str) -> EscapeError:
    """The error for a call faultfs does not model, recorded on ``fs`` (swallowing it fails)."""
    message = (
        f"{call} on a file under the FaultFS root {fs.root!r}: {why}, so faultfs does not "
        f"model it and will not let it reach the real kernel (which would fail with a bare EBADF "
        f"a library may swallow, testing its fallback instead). {instead}"
    )
    getattr(fs, "escapes", []).append(message)
    return EscapeError(message)


# ------------------------------------------------------------------ modelled


def sync_model(fs: Syscalls) -> None:
    """sync(2) on one simulated file system: a boundary before and after, everything durable."""
    with fs._lock:
        if fs.crashed:
            fs._alive("sync")
        op = fs._before("sync", fs.root, ())
        if fs.model.profile.sync_persists:
            fs.model.sync_all()
        fs._after(op)


def dup(fs: Syscalls, fd: int) -> int:
    """A new descriptor for the same open file description (shared offset and flags)."""
    with fs._lock:
        fs._alive("dup")
        handle = fs._handle(fd)
        new = next_fd()
        fs._fds[new] = handle
        FD_OWNERS[new] = fs._owner_ref
        return new


def _getfl(fs: Syscalls, fd: int) -> int:
    handle = fs._handle(fd)
    if not _kernel_flags:
        probe = _real_open(os.devnull, os.O_RDONLY)
        try:
            _kernel_flags.append(_real_fcntl(probe, fcntl.F_GETFL) & ~ACCMODE)
        finally:
            _real_close(probe)
    keep = ACCMODE | _SETFL_BITS | getattr(os, "O_SYNC", 0) | getattr(os, "O_DSYNC", 0)
    flags = handle.flags & keep
    if fd in _nonblocking:
        flags |= os.O_NONBLOCK
    return flags | _kernel_flags[0]


def _setfl(fs: Syscalls, fd: int, arg: int) -> int:
    # Linux changes only O_APPEND, O_ASYNC, O_DIRECT, O_NOATIME and O_NONBLOCK here.
    handle = fs._handle(fd)
    handle.flags = (handle.flags & ~_SETFL_BITS) | (arg & _SETFL_BITS)
    handle.append = bool(arg & os.O_APPEND)
    return 0


def fcntl_call(fs: Syscalls, fd: int, cmd: int, arg: Any) -> Any:
    if cmd == fcntl.F_GETFD:
        fs._handle(fd)
        return 0 if fd in _inheritable else fcntl.FD_CLOEXEC
    if cmd == fcntl.F_SETFD:
        fs._handle(fd)
        (_inheritable.discard if int(arg) & fcntl.FD_CLOEXEC else _inheritable.add)(fd)
        return 0
    if cmd == fcntl.F_GETFL:
        return _getfl(fs, fd)
    if cmd == fcntl.F_SETFL:
        return _setfl(fs, fd, int(arg))
    if cmd in (fcntl.F_DUPFD, getattr(fcntl, "F_DUPFD_CLOEXEC", fcntl.F_DUPFD)):
        return dup(fs, fd)
    locks = {getattr(fcntl, n, None) for n in ("F_SETLK", "F_SETLKW", "F_GETLK")}
    locks |= {getattr(fcntl, n, None) for n in ("F_OFD_SETLK", "F_OFD_SETLKW", "F_OFD_GETLK")}
    if cmd in locks:
        raise refuse(
            fs,
            f"fcntl.fcntl(fd, {cmd}) (a POSIX byte-range lock)",
            "byte-range locks are not modelled",
            "Lock the whole file with fcntl.flock or fcntl.lockf(fd, LOCK_EX), which faultfs "
            "models between the descriptors of this process.",
        )
    raise refuse(
        fs,
        f"fcntl.fcntl(fd, {cmd})",
        "faultfs models only F_GETFD, F_SETFD, F_GETFL, F_SETFL and F_DUPFD(_CLOEXEC)",
        "Keep this call out of the workload, or run this part on a real kernel.",
    )


def statvfs_near(root: str) -> os.statvfs_result:
    """statvfs of the real file system the root is on (its nearest existing ancestor)."""
    path = root
    while True:
        try:
            return _real_statvfs(path)
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if parent == path:
                raise
            path = parent


# ------------------------------------------------------------- replacements


def _patched(real: Any, name: str) -> Callable[..., Any]:
    """The replacement for ``os.name``/``fcntl.name`` whose first argument is a descriptor."""
    table: dict[str, Callable[..., Any]] = {
        "writev": lambda fs, fd, buffers: fs.write(fd, b"".join(buffers)),
        "pwritev": _pwritev,
        "readv": _readv,
        "preadv": _preadv,
        "dup": lambda fs, fd: dup(fs, fd),
        "fcntl": lambda fs, fd, cmd, arg=0: fcntl_call(fs, fd, cmd, arg),
        "set_inheritable": _set_inheritable,
        "get_inheritable": lambda fs, fd: (fs._handle(fd), fd in _inheritable)[1],
        "get_blocking": lambda fs, fd: (fs._handle(fd), fd not in _nonblocking)[1],
        "set_blocking": _set_blocking,
        "posix_fadvise": lambda fs, fd, *args: (fs._handle(fd), None)[1],
        "fstatvfs": lambda fs, fd: (fs._handle(fd), statvfs_near(fs.root))[1],
        "posix_fallocate": _fallocate,
    }
    model = table.get(name)

    def replacement(fd: Any, *args: Any, **kwargs: Any) -> Any:
        fs = _owner(fd) if type(fd) is int else _owner(_fd(fd))
        if fs is None:
            return real(fd, *args, **kwargs)
        fd = _fd(fd)
        if model is not None:
            return model(fs, fd, *args, **kwargs)
        raise _refusal(fs, name)

    replacement.__name__ = name
    replacement.__wrapped__ = real  # type: ignore[attr-defined]
    return replacement


def _pwritev(fs: Syscalls, fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
    if flags & getattr(os, "RWF_APPEND", 0):
        raise refuse(
            fs,
            "os.pwritev(..., RWF_APPEND)",
            "an append whose offset rules differ from O_APPEND is not modelled",
            "Open the file with O_APPEND and use os.write.",
        )
    n = fs.pwrite(fd, b"".join(buffers), offset)
    if flags & getattr(os, "RWF_SYNC", 0):  # per-write O_SYNC / O_DSYNC
        fs.fsync(fd)
    elif flags & getattr(os, "RWF_DSYNC", 0):
        fs.fsync(fd, "fdatasync")
    return n


def _fallocate(fs: Syscalls, fd: int, offset: int, length: int) -> None:
    """Allocation is invisible to the model but the size is not: a range past the end grows
    the file with zeros (unsynced, as any size change), as posix_fallocate(3) does."""
    if offset < 0 or length <= 0:
        raise oserror(errno.EINVAL)
    handle = fs._handle(fd)
    if handle.is_dir or not handle.writable:
        raise oserror(errno.EBADF)
    if offset + length > len(fs.model.inodes[handle.ino].data):
        fs.ftruncate(fd, offset + length)


def _fill(buffers: Any, data: bytes) -> int:
    done = 0
    for buffer in buffers:
        view = memoryview(buffer).cast("B")
        chunk = data[done : done + len(view)]
        view[: len(chunk)] = chunk
        done += len(chunk)
    return done


def _readv(fs: Syscalls, fd: int, buffers: Any) -> int:
    total = sum(memoryview(b).nbytes for b in buffers)
    return _fill(buffers, fs.read(fd, total))


def _preadv(fs: Syscalls, fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
    total = sum(memoryview(b).nbytes for b in buffers)
    return _fill(buffers, fs.pread(fd, total, offset))


def _set_inheritable(fs: Syscalls, fd: int, inheritable: bool) -> None:
    fs._handle(fd)
    (_inheritable.add if inheritable else _inheritable.discard)(fd)


def _set_blocking(fs: Syscalls, fd: int, blocking: bool) -> None:
    fs._handle(fd)
    (_nonblocking.discard if blocking else _nonblocking.add)(fd)


_REFUSED: dict[str, tuple[str, str]] = {
    "sendfile": (
        "the copy happens inside the kernel, not through Python's os and io",
        "Copy with os.read and os.write (shutil.copyfileobj), which faultfs models.",
    ),
    "copy_file_range": (
        "the copy happens inside the kernel, not through Python's os and io",
        "Copy with os.read and os.write (shutil.copyfileobj), which faultfs models.",
    ),
    "splice": (
        "the copy happens inside the kernel, not through Python's os and io",
        "Copy with os.read and os.write, which faultfs models.",
    ),
    "fchown": (
        "file ownership is not modelled",
        "Leave ownership out of the workload (chown the real files after the test).",
    ),
    "lockf": (
        "os.lockf takes byte-range locks, which are not modelled",
        "Lock the whole file with fcntl.flock or fcntl.lockf(fd, LOCK_EX), which faultfs "
        "models between the descriptors of this process.",
    ),
    "dup2": (
        "a simulated descriptor cannot be copied onto a real descriptor number",
        "Use os.dup, which faultfs models.",
    ),
    "fchdir": (
        "the real working directory cannot be a simulated directory",
        "Build paths with fs.path(...) instead of changing directory.",
    ),
}


def _refusal(fs: Syscalls, name: str) -> EscapeError:
    why, instead = _REFUSED.get(name, ("it is not modelled", "Keep it out of the workload."))
    return refuse(fs, f"os.{name}", why, instead)


_FD_FIRST = (
    "writev", "pwritev", "readv", "preadv", "dup", "set_inheritable", "get_inheritable",
    "get_blocking", "set_blocking", "posix_fadvise", "fstatvfs", "posix_fallocate", "fchown",
    "lockf", "dup2", "fchdir",
)  # fmt: skip
_TWO_FDS = ("sendfile", "copy_file_range", "splice")


def _either(real: Any, name: str) -> Callable[..., Any]:
    """The replacement for a copy between two descriptors: refused when either is simulated."""

    def replacement(a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        fs = _owner(a) or _owner(b)
        if fs is None:
            return real(a, b, *args, **kwargs)
        raise _refusal(fs, name)

    replacement.__name__ = name
    replacement.__wrapped__ = real  # type: ignore[attr-defined]
    return replacement


def _sync_all_active(stack: list[FaultFS], real: Callable[[], None]) -> Callable[[], None]:
    def sync() -> None:
        for fs in list(stack):
            sync_model(fs)
        real()  # files outside the roots (passthrough) are real

    sync.__name__ = "sync"
    sync.__wrapped__ = real  # type: ignore[attr-defined]
    return sync


def _statvfs(real: Any, route: Router) -> Callable[..., Any]:
    def statvfs(path: Any) -> Any:
        fs = _owner(path)
        if fs is not None:
            fs._handle(path)
            return statvfs_near(fs.root)
        r = route(path)
        if r is None:
            return real(path)
        r[0].stat(r[1])  # ENOENT for a missing path, as the real call
        return statvfs_near(r[0].root)

    statvfs.__name__ = "statvfs"
    statvfs.__wrapped__ = real  # type: ignore[attr-defined]
    return statvfs


def patches(stack: list[FaultFS], route: Router) -> list[tuple[object, str, object]]:
    """(module, name, replacement) for every call above that this platform has."""
    out: list[tuple[object, str, object]] = []
    for name in _FD_FIRST:
        if hasattr(os, name):
            out.append((os, name, _patched(getattr(os, name), name)))
    for name in _TWO_FDS:
        if hasattr(os, name):
            out.append((os, name, _either(getattr(os, name), name)))
    out.append((fcntl, "fcntl", _patched(fcntl.fcntl, "fcntl")))
    if hasattr(os, "sync"):
        out.append((os, "sync", _sync_all_active(stack, os.sync)))
    if hasattr(os, "statvfs"):
        out.append((os, "statvfs", _statvfs(os.statvfs, route)))
    return out
