"""numpy's file I/O under faultfs says why it fails (an outsider's np.save, session 26).

``numpy.save`` to a path (and ``ndarray.tofile``, ``numpy.load``, ``numpy.fromfile``)
dups the file's descriptor with ``os.dup`` (a simulated one under faultfs) and gives
it to C's ``fdopen``. That fails, so nothing reaches the real disk, but numpy's error
blamed the user's build: "Getting a FILE* from a Python file object via _fdopen
failed. If you built NumPy, you probably linked with the wrong debug/release
runtime". explore, in the workload and in the check, now raises an EscapeError that
says numpy did C I/O faultfs cannot see and how to keep it in Python.

``numpy_like_save`` does what numpy's C does, through ctypes (numpy is not among
the dev dependencies); with numpy installed (the CI image has it) the same runs
on numpy itself.
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
from collections.abc import Callable
from typing import Any

import pytest

from faultfs import FaultFS, explore
from faultfs.errors import EscapeError
from tests.support.faultfs_classic import fsync_dir

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.fdopen.restype = ctypes.c_void_p
_LIBC.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
_LIBC.fclose.argtypes = [ctypes.c_void_p]
NUMPY_WORDS = (
    "Getting a FILE* from a Python file object via _fdopen failed. If you built NumPy, "
    "you probably linked with the wrong debug/release runtime"
)


def numpy_like_save(path: str, data: bytes) -> None:
    """What ndarray.tofile does with a path: Python's open, os.dup, then C's fdopen."""
    with open(path, "wb") as handle:
        handle.flush()
        copy = os.dup(handle.fileno())
        stream = _LIBC.fdopen(copy, b"wb")
        if not stream:  # numpy sets this error, with no errno, and leaves the copy open
            raise OSError(NUMPY_WORDS)
        _LIBC.fclose(stream)  # (a real descriptor: only without faultfs)


def test_the_copy_really_goes_to_c_and_fails_there_only_under_faultfs(tmp_path: Any) -> None:
    """The stand-in is honest: on the real disk it works, under faultfs C's fdopen fails."""
    numpy_like_save(str(tmp_path / "real.bin"), b"x")
    fs = FaultFS(str(tmp_path / "sim"))
    with fs, pytest.raises(OSError, match="wrong debug/release runtime") as raised:
        numpy_like_save(fs.path("a.bin"), b"x")
    assert raised.value.errno is None
    assert ctypes.get_errno() == errno.EBADF  # the simulated number is no real descriptor
    assert not (tmp_path / "sim").exists()  # nothing reached the real disk


def _explore_words(workload: Callable[[FaultFS], None], check: Callable[[FaultFS], None]) -> str:
    with pytest.raises(EscapeError) as raised:
        explore(workload, check, modes=("power",))
    return str(raised.value)


def assert_says_why(words: str) -> None:
    assert "numpy handed the descriptor of a file under the FaultFS root to C" in words
    assert "C's fdopen cannot open a simulated descriptor" in words
    assert "If you built NumPy" in words  # numpy's own words, quoted
    assert "numpy.save(buf, a)" in words and "numpy.load(io.BytesIO(f.read()))" in words
    assert "Limits: what faultfs cannot see" in words


def test_a_save_in_the_workload_is_named_with_the_fix() -> None:
    def workload(fs: FaultFS) -> None:
        numpy_like_save(fs.path("a.bin"), b"x")
        fs.ack(1)

    words = _explore_words(workload, lambda img: None)
    assert_says_why(words)
    assert f"{os.path.basename(__file__)}:" in words  # where the call went into C


def test_a_load_in_the_check_is_named_with_the_fix() -> None:
    def workload(fs: FaultFS) -> None:
        with open(fs.path("a.bin"), "wb") as handle:
            handle.write(b"x")
            handle.flush()
            os.fsync(handle.fileno())
        fsync_dir(fs.root)
        fs.ack(1)

    def check(img: FaultFS) -> None:
        if os.path.exists(img.path("a.bin")):
            numpy_like_save(img.path("a.bin"), b"y")

    assert_says_why(_explore_words(workload, check))


def test_another_oserror_without_errno_is_left_as_it_is() -> None:
    def workload(fs: FaultFS) -> None:
        with open(fs.path("a.bin"), "wb") as handle:
            handle.write(b"x")
        raise OSError("the program's own error")

    with pytest.raises(OSError, match="the program's own error") as raised:
        explore(workload, lambda img: None, modes=("power",))
    assert not isinstance(raised.value, EscapeError)


def test_numpy_itself_and_the_fix_the_message_gives() -> None:
    numpy = pytest.importorskip("numpy", reason="numpy is not a dev dependency")

    def save(fs: FaultFS) -> None:
        numpy.save(fs.path("a.npy"), numpy.arange(4))
        fs.ack(1)

    words = _explore_words(save, lambda img: None)
    assert_says_why(words)
    assert words.startswith(f"{__file__}:"), words  # the line that called numpy.save

    def through_bytes(fs: FaultFS) -> None:  # the message's fix, made durable
        buf = io.BytesIO()
        numpy.save(buf, numpy.arange(4))
        with open(fs.path("a.npy"), "wb") as handle:
            handle.write(buf.getvalue())
            handle.flush()
            os.fsync(handle.fileno())
        fsync_dir(fs.root)
        fs.ack(1)

    def check(img: FaultFS) -> None:
        if img.acked:
            with open(img.path("a.npy"), "rb") as handle:
                assert list(numpy.load(io.BytesIO(handle.read()))) == [0, 1, 2, 3]

    assert not explore(through_bytes, check).failures
