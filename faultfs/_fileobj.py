"""builtins.open for simulated files: a raw file over the model, wrapped as io.open does.

The buffered and text layers are the standard library's own, so buffering,
newline translation, encodings, readline and iteration behave exactly as on a
real file; data reaches the model (and passes boundaries) when a buffer
flushes, as it reaches the kernel on a real system.
"""

from __future__ import annotations

import errno
import io
import os
from collections.abc import Callable
from typing import Any

from faultfs._buffered import track
from faultfs._fdtable import Handle, oserror
from faultfs._syscalls import Syscalls

_BUFFER_SIZE = io.DEFAULT_BUFFER_SIZE


class FaultFileIO(io.RawIOBase):
    """The raw layer (what io.FileIO is for real files) over a simulated descriptor."""

    def __init__(
        self,
        fs: Syscalls,
        fd: int,
        name: Any,
        mode: str,
        closefd: bool,
        handle: Handle | None = None,  # fd's, when the caller has it already
    ) -> None:
        super().__init__()
        if handle is None:
            handle = fs._handle(fd)
        self._fs = fs
        self._fd = fd
        self._readable = handle.readable
        self._writable = handle.writable
        self._closefd = closefd
        self.name = name
        self.mode = mode

    def readable(self) -> bool:
        return self._readable

    def writable(self) -> bool:
        return self._writable

    def seekable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    @property
    def closefd(self) -> bool:
        return self._closefd

    def fileno(self) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        return self._fd

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        chunk = self._fs.read(self._fd, len(view))
        view[: len(chunk)] = chunk
        return len(chunk)

    def readall(self) -> bytes:
        return self._fs.read(self._fd, -1)

    def write(self, data: Any) -> int:
        return self._fs.write(self._fd, data)

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        return self._fs.lseek(self._fd, pos, whence)

    def tell(self) -> int:
        return self._fs.lseek(self._fd, 0, os.SEEK_CUR)

    def truncate(self, size: int | None = None) -> int:
        if size is None:
            size = self.tell()
        self._fs.ftruncate(self._fd, size)
        return size

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
        finally:
            if self._closefd:
                self._fs.close(self._fd)

    def __repr__(self) -> str:
        return f"<FaultFileIO name={self.name!r} mode={self.mode!r}>"


_FLAGS_OF: dict[str, tuple[int, str]] = {}
"""The valid modes seen so far and their flags (a program uses a handful)."""


def _flags_for(mode: str) -> tuple[int, str]:
    """os.open flags and the raw mode string for an open() mode, validated as open() does."""
    if type(mode) is not str:
        return _parse_mode(mode)
    known = _FLAGS_OF.get(mode)
    if known is None:
        known = _FLAGS_OF[mode] = _parse_mode(mode)
    return known


def _parse_mode(mode: str) -> tuple[int, str]:
    chars = set(mode)
    if len(chars) != len(mode) or not chars <= set("rwaxbt+"):
        raise ValueError(f"invalid mode: {mode!r}")
    kinds = chars & set("rwax")
    if len(kinds) != 1:
        raise ValueError("must have exactly one of create/read/write/append mode")
    if "b" in chars and "t" in chars:
        raise ValueError("can't have text and binary mode at once")
    kind = kinds.pop()
    plus = "+" in chars
    flags = {
        "r": os.O_RDONLY,
        "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
        "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
    }[kind]
    if plus:
        flags = (flags & ~os.O_WRONLY) | os.O_RDWR
    raw_mode = {"r": "rb", "w": "wb", "a": "ab", "x": "xb"}[kind] + ("+" if plus else "")
    return flags | getattr(os, "O_CLOEXEC", 0), raw_mode


def _raw_file(
    fs: Syscalls, file: Any, path: str | None, flags: int, raw_mode: str, closefd: bool, opener: Any
) -> FaultFileIO:
    """The raw file open() and io.FileIO build on: ``path`` opened, or descriptor ``file``."""
    if path is None:
        fd = file
    elif opener is not None:
        fd = opener(path, flags)
    else:
        if not closefd:
            raise ValueError("Cannot use closefd=False with file name")
        fd = fs.open(path, flags, 0o666)
    handle = fs._handle(fd)
    if handle.is_dir:
        if path is not None:
            fs.close(fd)
        raise oserror(errno.EISDIR, path)
    raw = FaultFileIO(fs, fd, file, raw_mode, closefd, handle)
    return raw


def open_file(
    fs: Syscalls,
    file: Any,
    path: str | None,
    mode: str = "r",
    buffering: int = -1,
    encoding: str | None = None,
    errors: str | None = None,
    newline: str | None = None,
    closefd: bool = True,
    opener: Any = None,
) -> Any:
    """Open ``path`` (or wrap descriptor ``file`` when ``path`` is None) like io.open."""
    flags, raw_mode = _flags_for(mode)
    binary = "b" in mode
    if binary and (encoding is not None or errors is not None or newline is not None):
        raise ValueError("binary mode doesn't take an encoding, errors or newline argument")
    raw = _raw_file(fs, file, path, flags, raw_mode, closefd, opener)
    try:
        if "a" in mode:
            raw.seek(0, os.SEEK_END)
        line_buffering = buffering == 1
        if buffering in (1, -1):
            buffering = _BUFFER_SIZE
        if buffering == 0:
            if binary:
                return raw
            raise ValueError("can't have unbuffered text I/O")
        buffer: io.BufferedIOBase
        if "+" in mode:
            buffer = io.BufferedRandom(raw, buffering)
        elif "r" in mode:
            buffer = io.BufferedReader(raw, buffering)
        else:
            buffer = io.BufferedWriter(raw, buffering)
        if binary:
            if raw._writable:
                track(fs, buffer)  # an acknowledgement asks what it holds (faultfs._buffered)
            return buffer
        text = io.TextIOWrapper(buffer, encoding, errors, newline, line_buffering)
        text.mode = mode  # type: ignore[misc]
        if raw._writable:
            track(fs, text)
        return text
    except BaseException:
        raw.close()
        raise


def open_raw(
    fs: Syscalls, file: Any, path: str | None, mode: str, closefd: bool, opener: Any
) -> FaultFileIO:
    """What ``io.FileIO(file, mode, closefd, opener)`` opens, on the model."""
    if type(mode) is not str:
        raise TypeError(f"FileIO() argument 'mode' must be str, not {type(mode).__name__}")
    kinds = [c for c in mode if c in "rwxa"]
    if len(kinds) != 1 or mode.count("+") > 1 or not set(mode) <= set("rwxab+"):
        if set(mode) <= set("rwxab+t") and "t" in mode:
            raise ValueError(f"invalid mode: {mode}")
        raise ValueError(
            "Must have exactly one of create/read/write/append mode and at most one plus"
        )
    flags, raw_mode = _flags_for(mode.replace("b", "") or mode)
    if "+" in raw_mode and not raw_mode.startswith(("a", "x")):
        raw_mode = "rb+"  # as io.FileIO names "w+" and "r+"
    raw = _raw_file(fs, file, path, flags, raw_mode, closefd, opener)
    if "a" in mode:
        try:
            raw.seek(0, os.SEEK_END)
        except BaseException:
            raw.close()
            raise
    return raw


_REAL_FILEIO = io.FileIO


class _FileIOType(type):
    """The patched io.FileIO's type: isinstance and issubclass hold for real and simulated files."""

    def __instancecheck__(cls, obj: Any) -> bool:
        if "_faultfs_shim" not in cls.__dict__:  # a subclass made during the run
            return type.__instancecheck__(cls, obj)
        return isinstance(obj, _REAL_FILEIO | FaultFileIO)

    def __subclasscheck__(cls, sub: Any) -> bool:
        if "_faultfs_shim" not in cls.__dict__:
            return type.__subclasscheck__(cls, sub)
        return issubclass(sub, _REAL_FILEIO | FaultFileIO)


def file_io_class(
    route: Callable[[Any], tuple[Syscalls, str] | None], owner: Callable[[Any], Syscalls | None]
) -> type:
    """``io.FileIO`` while a FaultFS is active: a simulated raw file under a root, else a real one.

    Libraries build their own stacks on it (safer opens ``io.FileIO(temp, "w")`` and
    wraps it in io.BufferedWriter), so refusing it left them untestable. Calling the
    class returns a FaultFileIO for a path under an active root or a simulated
    descriptor, and a real io.FileIO otherwise; neither is an instance of the class
    itself, so ``type.__call__`` runs no ``__init__`` on them.
    """

    class FileIO(_REAL_FILEIO, metaclass=_FileIOType):  # type: ignore[metaclass]
        _faultfs_shim = True

        def __new__(
            cls, file: Any, mode: str = "r", closefd: bool = True, opener: Any = None
        ) -> Any:
            if cls is not FileIO:  # a subclass made during the run: a real file
                return _REAL_FILEIO.__new__(cls, file, mode, closefd, opener)  # type: ignore[call-arg]
            if type(file) is int:
                fs = owner(file)
                if fs is not None:
                    return open_raw(fs, file, None, mode, closefd, opener)
            elif (r := route(file)) is not None:
                return open_raw(r[0], file, r[1], mode, closefd, opener)
            return _REAL_FILEIO(file, mode, closefd, opener)

    FileIO.__module__ = "io"
    FileIO.__qualname__ = "FileIO"
    return FileIO
