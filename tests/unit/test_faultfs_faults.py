"""Faults besides crashes: fsync EIO (fsyncgate semantics), ENOSPC, short writes."""

from __future__ import annotations

import errno
import os

import pytest

from faultfs import FaultFS
from faultfs.errors import ConfigError

ROOT = "/faultfs-faults"


@pytest.fixture
def fs() -> FaultFS:
    with FaultFS(ROOT) as fs:
        fd = os.open(fs.path("log"), os.O_WRONLY | os.O_CREAT)
        os.write(fd, b"synced\n")
        os.fsync(fd)
        os.close(fd)
        dfd = os.open(fs.root, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        yield fs


def append(fs: FaultFS, data: bytes) -> int:
    fd = os.open(fs.path("log"), os.O_WRONLY | os.O_APPEND)
    os.write(fd, data)
    return fd


def test_eio_drops_the_dirty_pages_but_the_process_still_reads_them(fs: FaultFS) -> None:
    fd = append(fs, b"lost\n")
    fs.fail_next_fsync(fs.path("log"))
    with pytest.raises(OSError) as info:
        os.fsync(fd)
    assert info.value.errno == errno.EIO
    os.fsync(fd)  # the retry succeeds: the pages are clean now
    os.close(fd)
    assert fs.read_file("log") == b"synced\nlost\n"
    assert fs.crash_image("process").tree() == {"log": b"synced\nlost\n"}
    assert fs.crash_image("power").tree() == {"log": b"synced\n"}
    assert [img.tree() for img in fs.crash_images("reorder")] == [{"log": b"synced\n"}]


def test_later_writes_after_eio_do_not_resurrect_the_lost_ones(fs: FaultFS) -> None:
    fd = append(fs, b"lost\n")
    fs.fail_next_fsync()
    with pytest.raises(OSError):
        os.fsync(fd)
    os.write(fd, b"later\n")
    os.fsync(fd)
    os.close(fd)
    # The disk got "later" at its offset; the bytes of "lost" never reached it.
    assert fs.crash_image("power").tree() == {"log": b"synced\n\0\0\0\0\0later\n"}
    fs.model.check_invariants()


def test_fail_next_fsync_targets_one_file(fs: FaultFS) -> None:
    other = os.open(fs.path("other"), os.O_WRONLY | os.O_CREAT)
    fs.fail_next_fsync(fs.path("log"), errno=errno.EROFS)
    os.fsync(other)  # not the target: succeeds
    fd = append(fs, b"x")
    with pytest.raises(OSError) as info:
        os.fsync(fd)
    assert info.value.errno == errno.EROFS
    os.fsync(fd)
    os.close(fd)
    os.close(other)


def test_enospc_after_a_byte_budget_with_a_short_crossing_write(fs: FaultFS) -> None:
    fs.fail_writes_with(errno.ENOSPC, after_bytes=4)
    fd = os.open(fs.path("log"), os.O_WRONLY | os.O_APPEND)
    assert os.write(fd, b"abcdef") == 4
    with pytest.raises(OSError) as info:
        os.write(fd, b"g")
    assert info.value.errno == errno.ENOSPC
    fs.fail_writes_with(None)
    assert os.write(fd, b"h") == 1
    os.close(fd)
    assert fs.read_file("log") == b"synced\nabcdh"


def test_buffered_writes_surface_enospc(fs: FaultFS) -> None:
    fs.fail_writes_with(errno.ENOSPC, after_bytes=0)
    with pytest.raises(OSError) as info, open(fs.path("full"), "w") as handle:
        handle.write("does not fit")
    assert info.value.errno == errno.ENOSPC


def test_short_writes_are_reported_and_buffered_io_loops(fs: FaultFS) -> None:
    fs.short_writes(3)
    fd = os.open(fs.path("s"), os.O_WRONLY | os.O_CREAT)
    assert os.write(fd, b"abcdef") == 3  # code that ignores this count loses data
    os.close(fd)
    with open(fs.path("b"), "wb") as handle:
        handle.write(b"0123456789")
    fs.short_writes(None)
    assert fs.read_file("s") == b"abc"
    assert fs.read_file("b") == b"0123456789"


def test_fault_argument_validation(fs: FaultFS) -> None:
    with pytest.raises(ConfigError):
        fs.short_writes(0)
    with pytest.raises(ConfigError):
        fs.fail_writes_with(errno.ENOSPC, after_bytes=-1)
    with pytest.raises(ConfigError, match="not under"):
        fs.fail_next_fsync("/elsewhere/file")
    with pytest.raises(FileNotFoundError):
        fs.fail_next_fsync(fs.path("missing"))
