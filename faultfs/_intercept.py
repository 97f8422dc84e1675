"""Interception: module attributes of os, io, builtins and fcntl routed to the model.

While at least one FaultFS is active, the functions below replace their
originals, and so do the names loaded modules bound to the originals at import
time (``from os import fsync``; see :mod:`faultfs._escapes`). A path under an
active root goes to that FaultFS (the most recently activated one wins when
roots nest); a simulated descriptor goes to the FaultFS that issued it;
anything else reaches the real system, or is refused when the innermost
FaultFS says ``outside="refuse"``. Relative paths resolve against the real
working directory, so they are outside the root unless that directory is in it.
The test framework's own I/O (pytest, Hypothesis) is never refused.
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import gc
import io
import os
import pathlib
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from types import BuiltinFunctionType
from typing import TYPE_CHECKING, Any

from faultfs import _cext, _escapes, _fdcalls, _late_imports, _others, _processes, _threads
from faultfs._fdtable import FAKE_FD_BASE, FD_OWNERS, fd_owner, oserror
from faultfs._fileobj import file_io_class, open_file
from faultfs._outside import outside, prime_tempdir
from faultfs._syscalls import Syscalls
from faultfs.errors import ConfigError, UnsupportedOperation

if TYPE_CHECKING:
    from faultfs._fs import FaultFS

_stack: list[FaultFS] = []
_saved: list[tuple[object, str, object]] = []
_saved_bindings: list[_escapes.Binding] = []
_install_lock = threading.Lock()
_froze_gc = False
# The freeze count while nothing but faultfs has frozen anything: Python 3.12 starts
# with tuples of its own in the permanent generation (375 on 3.12.1), and waiting
# for 0 there meant never freezing, so each collection at exit walked the whole heap.
_unfrozen_count = gc.get_freeze_count()
_OS_NAMES = (
    *("open", "read", "pread", "write", "pwrite", "close", "fsync", "fdatasync", "ftruncate"),
    *("truncate", "lseek", "fstat", "stat", "lstat", "replace", "rename", "unlink", "remove"),
    *("mkdir", "rmdir", "listdir", "scandir", "link", "symlink", "readlink", "chmod", "fchmod"),
    *("utime", "access", "isatty", "listxattr", "getxattr", "setxattr", "removexattr"),
)
_real: dict[str, Any] = {name: getattr(os, name) for name in _OS_NAMES if hasattr(os, name)}
_real_open = builtins.open
_real_flock = fcntl.flock
_real_lockf = fcntl.lockf
_PATHS = frozenset({pathlib.PosixPath, pathlib.PurePosixPath})


# ------------------------------------------------------------------ routing


def _route(path: Any, dir_fd: int | None = None) -> tuple[FaultFS, str] | None:
    """(file system, normalised absolute path) for a simulated path, else None."""
    if type(path) is str:
        p = path
    elif type(path) in _PATHS and isinstance(kept := getattr(path, "_str", None), str):
        p = kept  # the text pathlib keeps once it formatted it (os.fspath: two more calls)
    elif isinstance(path, int):
        return None
    else:
        p = os.fspath(path)
        if isinstance(p, bytes):
            p = os.fsdecode(p)
    relative = False
    if not p.startswith("/"):
        if dir_fd is not None:
            owner = fd_owner(dir_fd)
            if owner is None:
                return None
            p = owner.fd_path(dir_fd) + "/" + p
        else:
            p = os.getcwd() + "/" + p
            relative = True
    if "/." in p or "//" in p or (p.endswith("/") and len(p) > 1):
        p = os.path.normpath(p)
    for fs in reversed(_stack):  # owner_of(p), inlined: this is the hot path
        if p.startswith(fs._root_slash) or p == fs.root:
            fs.touches += 1
            return fs, p
    if _stack:
        outside(_stack, path, p, relative)
    return None


def owner_of(p: str) -> FaultFS | None:
    """The active FaultFS whose root holds the absolute normalised path ``p`` (no side effects)."""
    for fs in reversed(_stack):
        if p.startswith(fs._root_slash) or p == fs.root:
            return fs
    return None


def _owner(fd: Any) -> Syscalls | None:
    if type(fd) is int and fd >= FAKE_FD_BASE:
        ref = FD_OWNERS.get(fd)  # fd_owner, inlined: every descriptor call comes here
        return None if ref is None else ref()
    return None


# The descriptor calls a program makes most (read, write, pwrite, close, fsync, fstat,
# lseek) inline _owner: ``FD_OWNERS`` holds only simulated descriptors, so a real one
# misses there as it fails ``fd >= FAKE_FD_BASE``, and the weak reference says whether
# its file system still lives. One Python call less per routed call.


def _fd_of(obj: Any) -> Any:
    return obj if isinstance(obj, int) else obj.fileno()


def _pair(src: Any, dst: Any, src_dir_fd: Any, dst_dir_fd: Any) -> tuple[Any, str, str] | None:
    a = _route(src, src_dir_fd)
    b = _route(dst, dst_dir_fd)
    if a is None and b is None:
        return None
    if a is None or b is None or a[0] is not b[0]:
        raise oserror(errno.EXDEV, os.fspath(src), os.fspath(dst))
    return a[0], a[1], b[1]


# ------------------------------------------------------------ os functions


def _open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
    r = _route(path, dir_fd)
    if r is None:
        return _real["open"](path, flags, mode, dir_fd=dir_fd)
    return r[0].open(r[1], flags, mode)


def _read(fd: int, n: int) -> bytes:
    ref = FD_OWNERS.get(fd) if type(fd) is int else None
    fs = None if ref is None else ref()
    return _real["read"](fd, n) if fs is None else fs.read(fd, n)


def _pread(fd: int, n: int, offset: int) -> bytes:
    ref = FD_OWNERS.get(fd) if type(fd) is int else None
    fs = None if ref is None else ref()
    if fs is None:
        return _real["pread"](fd, n, offset)
    return fs.pread(fd, n, offset)


def _write(fd: int, data: Any) -> int:
    ref = FD_OWNERS.get(fd) if type(fd) is int else None
    fs = None if ref is None else ref()
    return _real["write"](fd, data) if fs is None else fs.write(fd, data)


def _pwrite(fd: int, data: Any, offset: int) -> int:
    ref = FD_OWNERS.get(fd) if type(fd) is int else None
    fs = None if ref is None else ref()
    if fs is None:
        return _real["pwrite"](fd, data, offset)
    return fs.pwrite(fd, data, offset)


def _close(fd: int) -> None:
    ref = FD_OWNERS.get(fd) if type(fd) is int else None
    fs = None if ref is None else ref()
    if fs is None:
        _real["close"](fd)
    else:
        fs.close(fd)


def _fsync(fd: Any) -> None:
    fd = fd if type(fd) is int else _fd_of(fd)
    ref = FD_OWNERS.get(fd) if type(fd) is int else None
    fs = None if ref is None else ref()
    if fs is None:
        _real["fsync"](fd)
    else:
        fs.fsync(fd)


def _fdatasync(fd: Any) -> None:
    fd = _fd_of(fd)
    fs = _owner(fd)
    if fs is None:
        _real["fdatasync"](fd)
    else:
        fs.fsync(fd, "fdatasync")


def _ftruncate(fd: int, length: int) -> None:
    fs = _owner(fd)
    if fs is None:
        _real["ftruncate"](fd, length)
    else:
        fs.ftruncate(fd, length)


def _truncate(path: Any, length: int) -> None:
    fs = _owner(path)
    if fs is not None:
        fs.ftruncate(path, length)
        return
    r = _route(path)
    if r is None:
        _real["truncate"](path, length)
    else:
        r[0].truncate(r[1], length)


def _lseek(fd: int, pos: int, how: int) -> int:
    ref = FD_OWNERS.get(fd) if type(fd) is int else None
    fs = None if ref is None else ref()
    return _real["lseek"](fd, pos, how) if fs is None else fs.lseek(fd, pos, how)


def _fstat(fd: int) -> os.stat_result:
    ref = FD_OWNERS.get(fd) if type(fd) is int else None
    fs = None if ref is None else ref()
    return _real["fstat"](fd) if fs is None else fs.fstat(fd)


def _stat(path: Any, *, dir_fd: int | None = None, follow_symlinks: bool = True) -> Any:
    if type(path) is int:  # a descriptor (_owner only for one: a start stats many paths)
        fs = _owner(path)
        if fs is not None:
            return fs.fstat(path)
    r = _route(path, dir_fd)
    if r is None:
        return _real["stat"](path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
    return r[0].stat(r[1])


def _lstat(path: Any, *, dir_fd: int | None = None) -> Any:
    r = _route(path, dir_fd)
    return _real["lstat"](path, dir_fd=dir_fd) if r is None else r[0].stat(r[1])


def _replace(src: Any, dst: Any, *, src_dir_fd: Any = None, dst_dir_fd: Any = None) -> None:
    r = _pair(src, dst, src_dir_fd, dst_dir_fd)
    if r is None:
        _real["replace"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
    else:
        r[0].rename(r[1], r[2])


def _rename(src: Any, dst: Any, *, src_dir_fd: Any = None, dst_dir_fd: Any = None) -> None:
    r = _pair(src, dst, src_dir_fd, dst_dir_fd)
    if r is None:
        _real["rename"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
    else:
        r[0].rename(r[1], r[2])


def _link(
    src: Any,
    dst: Any,
    *,
    src_dir_fd: Any = None,
    dst_dir_fd: Any = None,
    follow_symlinks: bool = True,
) -> None:
    r = _pair(src, dst, src_dir_fd, dst_dir_fd)
    if r is None:
        _real["link"](
            src,
            dst,
            src_dir_fd=src_dir_fd,
            dst_dir_fd=dst_dir_fd,
            follow_symlinks=follow_symlinks,
        )
    else:
        r[0].link(r[1], r[2])


def _unlink(path: Any, *, dir_fd: int | None = None) -> None:
    r = _route(path, dir_fd)
    if r is None:
        _real["unlink"](path, dir_fd=dir_fd)
    else:
        r[0].unlink(r[1])


def _mkdir(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
    r = _route(path, dir_fd)
    if r is None:
        _real["mkdir"](path, mode, dir_fd=dir_fd)
    else:
        r[0].mkdir(r[1], mode)


def _rmdir(path: Any, *, dir_fd: int | None = None) -> None:
    r = _route(path, dir_fd)
    if r is None:
        _real["rmdir"](path, dir_fd=dir_fd)
    else:
        r[0].rmdir(r[1])


def _dir_target(path: Any) -> tuple[FaultFS | Syscalls, str] | None:
    fs = _owner(path) if type(path) is int else None
    if fs is not None:
        return fs, fs.fd_path(path)
    return _route("." if path is None else path)


def _listdir(path: Any = None) -> list[Any]:
    r = _dir_target(path)
    if r is None:
        return _real["listdir"]("." if path is None else path)
    names = r[0].listdir(r[1])
    if isinstance(path, bytes):
        return [os.fsencode(n) for n in names]
    return names


def _scandir(path: Any = None) -> Any:
    r = _dir_target(path)
    if r is None:
        return _real["scandir"]("." if path is None else path)
    prefix = "" if isinstance(path, int) else os.fsdecode(os.fspath("." if path is None else path))
    return r[0].scandir(r[1], prefix)


def _symlink(src: Any, dst: Any, target_is_directory: bool = False, **kw: Any) -> None:
    if _route(dst, kw.get("dir_fd")) is not None:
        raise UnsupportedOperation(
            f"os.symlink({dst!r}): faultfs does not model symbolic links; "
            "create them outside the root"
        )
    _real["symlink"](src, dst, target_is_directory, **kw)


def _readlink(path: Any, *, dir_fd: int | None = None) -> Any:
    r = _route(path, dir_fd)
    if r is None:
        return _real["readlink"](path, dir_fd=dir_fd)
    r[0].stat(r[1])  # ENOENT for a missing path
    raise oserror(errno.EINVAL, r[1])  # it exists and, having no symlinks, is not one


def _chmod(
    path: Any, mode: int, *, dir_fd: int | None = None, follow_symlinks: bool = True
) -> None:
    fs = _owner(path)
    if fs is not None:
        fs.fchmod(path, mode)
        return
    r = _route(path, dir_fd)
    if r is None:
        _real["chmod"](path, mode, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
    else:
        r[0].chmod(r[1], mode)


def _fchmod(fd: int, mode: int) -> None:
    fs = _owner(fd)
    if fs is None:
        _real["fchmod"](fd, mode)
    else:
        fs.fchmod(fd, mode)


def _utime(path: Any, times: Any = None, **kw: Any) -> None:
    fs = _owner(path)
    r = (fs, fs.fd_path(path)) if fs is not None else _route(path, kw.get("dir_fd"))
    if r is None:
        _real["utime"](path, times, **kw)
        return
    ns = kw.get("ns")
    mtime_ns = ns[1] if ns is not None else None if times is None else int(times[1] * 1e9)
    r[0].utime(r[1], mtime_ns)


def _access(path: Any, mode: int, **kw: Any) -> bool:
    r = _route(path, kw.get("dir_fd"))
    if r is None:
        return _real["access"](path, mode, **kw)
    return r[0].exists(r[1])


def _isatty(fd: int) -> bool:
    return False if _owner(fd) is not None else _real["isatty"](fd)


def _xattr(name: str) -> Any:
    real = _real[name]

    def xattr(path: Any, *args: Any, **kw: Any) -> Any:
        if _owner(path) is not None or _route(path, kw.get("dir_fd")) is not None:
            raise oserror(errno.ENOTSUP, str(path))  # shutil.copystat skips ENOTSUP
        return real(path, *args, **kw)

    xattr.__name__ = name
    return xattr


# ------------------------------------------------------- open, fcntl locks


def _builtin_open(file: Any, mode: str = "r", buffering: int = -1, *args: Any, **kw: Any) -> Any:
    fs = _owner(file) if type(file) is int else None
    if fs is not None:
        return open_file(fs, file, None, mode, buffering, *args, **kw)
    r = _route(file) if not isinstance(file, int) else None
    if r is None:
        return _real_open(file, mode, buffering, *args, **kw)
    return open_file(r[0], file, r[1], mode, buffering, *args, **kw)


def _flock(fd: Any, operation: int) -> None:
    fd = _fd_of(fd)
    fs = _owner(fd)
    if fs is None:
        _real_flock(fd, operation)
    else:
        fs.flock(fd, operation)


def _lockf(fd: Any, cmd: int, *args: Any) -> Any:
    fd = _fd_of(fd)
    fs = _owner(fd)
    if fs is None:
        return _real_lockf(fd, cmd, *args)
    fs.flock(fd, cmd)  # whole-file locks: byte ranges are not modelled
    return None


# --------------------------------------------------------------- install

_OS_WRAPPERS: dict[str, Any] = {
    "open": _open,
    "read": _read,
    "pread": _pread,
    "write": _write,
    "pwrite": _pwrite,
    "close": _close,
    "fsync": _fsync,
    "fdatasync": _fdatasync,
    "ftruncate": _ftruncate,
    "truncate": _truncate,
    "lseek": _lseek,
    "fstat": _fstat,
    "stat": _stat,
    "lstat": _lstat,
    "replace": _replace,
    "rename": _rename,
    "unlink": _unlink,
    "remove": _unlink,
    "mkdir": _mkdir,
    "rmdir": _rmdir,
    "listdir": _listdir,
    "scandir": _scandir,
    "link": _link,
    "symlink": _symlink,
    "readlink": _readlink,
    "chmod": _chmod,
    "fchmod": _fchmod,
    "utime": _utime,
    "access": _access,
    "isatty": _isatty,
}
for _name in ("listxattr", "getxattr", "setxattr", "removexattr"):
    if _name in _real:
        _OS_WRAPPERS[_name] = _xattr(_name)


def _patches() -> list[tuple[object, str, object]]:
    patches: list[tuple[object, str, object]] = [
        (os, name, fn) for name, fn in _OS_WRAPPERS.items() if name in _real
    ]
    patches += [
        (builtins, "open", _builtin_open),
        (io, "open", _builtin_open),
        (io, "FileIO", file_io_class(_route, _owner)),  # libraries stack their own buffers on it
        (fcntl, "flock", _flock),
        (fcntl, "lockf", _lockf),
        # shutil's descriptor-based rmtree and sendfile copy need calls the
        # model does not offer; their portable fallbacks use plain os calls.
        (shutil, "_use_fd_functions", False),
        (shutil, "_USE_CP_SENDFILE", False),
        # Work submitted to a thread pool remembers its submitter (faultfs._threads).
        (ThreadPoolExecutor, "submit", _threads.submit),
        # fork, child processes told a root, FIFOs: they would leave the simulated process.
        *_processes.patches(_stack, _route),
    ]
    patches += _fdcalls.patches(_stack, _route)
    return [(m, n, _escapes.not_binding(getattr(m, n), r)) for m, n, r in patches]


_PATCHES = _patches()
for _module, _name, _replacement in _PATCHES:
    _original = getattr(_module, _name)
    if isinstance(_original, BuiltinFunctionType):  # what modules may have bound early
        _escapes.register(_original, _replacement, f"{getattr(_module, '__name__', '?')}.{_name}")


_roots_seen: set[str] = set()


def _guard_real_root(root: str) -> None:
    """Install the escape audit hook once a root that exists on the real disk is activated."""
    if root in _roots_seen:
        return
    _roots_seen.add(root)
    try:
        _real["stat"](root)
    except OSError:
        return  # a simulated root: escaped calls fail on the real disk (ENOENT) and get named
    _escapes.install_audit_hook(_stack, owner_of)


def _simulated_fd(fd: int) -> tuple[FaultFS, str] | None:
    """(owner, path) of a simulated descriptor, for the hook naming mmap on one."""
    owner = _owner(fd)
    if owner is None:
        return None
    try:
        return owner, owner.fd_path(fd)  # type: ignore[return-value]
    except OSError:
        return owner, f"descriptor {fd}"  # type: ignore[return-value]


def activate(fs: FaultFS) -> None:
    global _froze_gc
    with _install_lock:
        if fs in _stack:
            raise ConfigError(f"FaultFS at {fs.root!r} is already active")
        if not _stack:
            _others.refuse_if_patched()
            prime_tempdir()
        _guard_real_root(fs.root)
        if not _stack:
            # What exists now is frozen out of the collector, so collecting a
            # run's garbage before deactivation (collect()) costs only the run's.
            _froze_gc = gc.get_freeze_count() == _unfrozen_count
            if _froze_gc:
                gc.freeze()
            _escapes.patch_bindings(_saved_bindings)
            for module, name, replacement in _PATCHES:
                _saved.append((module, name, getattr(module, name)))
                setattr(module, name, replacement)
            _others.guard(_saved)
            _patch_blind_spots()
            _late_imports.install(_patched_late)
        _stack.append(fs)


def _patch_blind_spots() -> None:
    """Patch the C stores (sqlite3, mmap, _cext's) loaded and not patched yet."""
    blind = _escapes.blind_spots(owner_of, _simulated_fd) + _cext.blind_libraries(owner_of)
    for module, name, replacement in blind:
        _saved.append((module, name, getattr(module, name)))
        setattr(module, name, replacement)


def _patched_late() -> None:
    """A C store finished loading while a FaultFS is active (faultfs._late_imports)."""
    with _install_lock:
        if _stack:
            _patch_blind_spots()


def deactivate(fs: FaultFS) -> None:
    global _unfrozen_count
    with _install_lock:
        if fs not in _stack:
            raise ConfigError(f"FaultFS at {fs.root!r} is not active")
        _stack.remove(fs)
        if not _stack:
            _late_imports.uninstall()
            while _saved:
                module, name, original = _saved.pop()
                setattr(module, name, original)
            _escapes.unpatch_bindings(_saved_bindings)
            _escapes.unbind_run()  # names the run's imports bound to a patch: the originals
            if _froze_gc:
                gc.unfreeze()  # what was frozen before faultfs loaded too: none is left
                _unfrozen_count = 0


def active() -> list[FaultFS]:
    """The active file systems, innermost last."""
    return list(_stack)
