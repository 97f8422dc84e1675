"""Durability by means other than fsync(fd): os.sync(), O_SYNC, O_DSYNC, pwritev's RWF_*SYNC.

Linux's sync(2) waits until every file system's data and metadata are written;
an O_SYNC write returns once its data and metadata are durable (write + fsync),
an O_DSYNC write once its data and what is needed to read it back, its size,
are (write + fdatasync). Code that relies on them must not be reported
"never fsynced"; code that crashes before they return must still lose.
"""

from __future__ import annotations

import os

import pytest

from faultfs import FaultFS, HealthCheck, explore
from faultfs.errors import ExploreFailed

ROOT = "/faultfs-sync-variants"
LINUX_PROFILES = ("posix", "ext4-ordered")


def _check_f(img: FaultFS) -> None:
    if img.acked:
        with open(img.path("f"), "rb") as f:
            assert f.read() == b"x" * 10


def _fsync_root(fs: FaultFS) -> None:
    d = os.open(fs.root, os.O_RDONLY)
    os.fsync(d)
    os.close(d)


def _write_sync_ack(fs: FaultFS) -> None:
    fd = os.open(fs.path("f"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"x" * 10)
    os.close(fd)
    os.sync()
    fs.ack(1)


@pytest.mark.parametrize("profile", LINUX_PROFILES)
def test_os_sync_makes_data_and_entries_durable(profile: str) -> None:
    def workload(fs: FaultFS) -> None:
        os.mkdir(fs.path("d"))
        fd = os.open(fs.path("d", "f"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"x" * 10)
        os.close(fd)
        os.sync()
        fs.ack(1)

    def check(img: FaultFS) -> None:
        if img.acked:
            with open(img.path("d", "f"), "rb") as f:
                assert f.read() == b"x" * 10

    explore(workload, check, profile=profile, root=ROOT).assert_ok()


def test_a_crash_before_os_sync_returns_still_loses() -> None:
    def check(img: FaultFS) -> None:  # wants the data even before the acknowledgement
        with open(img.path("f"), "rb") as f:
            assert f.read() == b"x" * 10

    # the check rejects the empty start on purpose: it maps where the data goes missing
    off = [HealthCheck.check_fails_at_start]
    report = explore(_write_sync_ack, check, root=ROOT, modes="power", suppress_health_check=off)
    assert ("before", "sync") in {(f.phase, f.op.kind) for f in report.failures}
    assert ("after", "sync") not in {(f.phase, f.op.kind) for f in report.failures}


def test_os_sync_under_lazyfs_leaves_the_data_in_lazyfs_cache() -> None:
    """sync(2) sends a FUSE server no fsync: LazyFS keeps the data cached (docs/faultfs.md)."""

    report = explore(_write_sync_ack, _check_f, profile="lazyfs", root=ROOT, modes="power")
    with pytest.raises(ExploreFailed, match="never fsynced before it was acknowledged"):
        report.assert_ok()


@pytest.mark.parametrize("profile", ("posix", "ext4-ordered", "lazyfs"))
@pytest.mark.parametrize("flag", ("O_SYNC", "O_DSYNC"))
def test_synchronized_writes_are_durable_when_they_return(profile: str, flag: str) -> None:
    def workload(fs: FaultFS) -> None:
        fd = os.open(fs.path("f"), os.O_WRONLY | os.O_CREAT | getattr(os, flag), 0o644)
        _fsync_root(fs)
        os.write(fd, b"x" * 4)
        os.pwrite(fd, b"x" * 6, 4)
        os.close(fd)
        fs.ack(1)

    explore(workload, _check_f, profile=profile, root=ROOT).assert_ok()


@pytest.mark.parametrize(("flag", "kind"), (("O_SYNC", "fsync"), ("O_DSYNC", "fdatasync")))
def test_a_synchronized_write_is_a_write_then_its_sync(flag: str, kind: str) -> None:
    """The crash boundaries of an O_SYNC write: before it, after the write (its data in the
    page cache, so a power loss may still tear or lose it: the call has not returned),
    and after the sync, when it is durable."""
    with FaultFS(ROOT) as fs:
        fd = os.open(fs.path("f"), os.O_WRONLY | os.O_CREAT | getattr(os, flag), 0o644)
        before = len(fs.trace)
        os.write(fd, b"x" * 10)
        assert [op.kind for op in fs.trace[before:]] == ["write", kind]
        assert fs.model.inodes[2].durable == b"x" * 10
        os.close(fd)


def test_pwritev_rwf_dsync_is_durable_when_it_returns() -> None:
    rwf_dsync = getattr(os, "RWF_DSYNC", None)
    if rwf_dsync is None:
        pytest.skip("no RWF_DSYNC on this platform")
    with FaultFS(ROOT) as fs:
        fd = os.open(fs.path("f"), os.O_WRONLY | os.O_CREAT, 0o644)
        assert os.pwritev(fd, [b"ab", b"cd"], 0, rwf_dsync) == 4
        assert fs.model.inodes[2].durable == b"abcd"
        os.close(fd)
