"""The crash counter: boundaries, arming, uncatchable crashes, the frozen process."""

from __future__ import annotations

import os

import pytest

from faultfs import FaultFS, IOAfterCrash, SimulatedCrash
from faultfs.errors import ConfigError

ROOT = "/faultfs-crash"


def atomic_save(fs: FaultFS, data: bytes) -> None:
    tmp, target = fs.path("s.tmp"), fs.path("s")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # create: 2 boundaries
    os.write(fd, data)  # 2
    os.fsync(fd)  # 2
    os.close(fd)  # none: closing changes nothing on disk
    os.replace(tmp, target)  # 2
    dfd = os.open(fs.root, os.O_RDONLY | os.O_DIRECTORY)  # none
    os.fsync(dfd)  # 2
    os.close(dfd)


def test_counting_mode_counts_two_boundaries_per_mutation() -> None:
    fs = FaultFS(ROOT)
    with fs:
        atomic_save(fs, b"x")
        assert os.path.exists(fs.path("s"))  # reads are no boundaries
    assert fs.boundaries == 10
    assert [op.kind for op in fs.trace] == ["create", "write", "fsync", "rename", "fsync"]
    assert all(op.site.startswith(__file__) for op in fs.trace)


def test_truncating_an_existing_file_is_a_mutation_reopening_is_not() -> None:
    fs = FaultFS(ROOT)
    with fs:
        os.close(os.open(fs.path("f"), os.O_WRONLY | os.O_CREAT))
        os.close(os.open(fs.path("f"), os.O_WRONLY | os.O_CREAT))
        assert fs.boundaries == 2
        os.close(os.open(fs.path("f"), os.O_WRONLY | os.O_TRUNC))
        assert fs.boundaries == 4
        assert fs.trace[-1].kind == "truncate"


@pytest.mark.parametrize(
    ("boundary", "phase", "kind", "visible"),
    [
        (1, "before", "create", {}),
        (2, "after", "create", {"s.tmp": b""}),
        (4, "after", "write", {"s.tmp": b"data"}),
        (7, "before", "rename", {"s.tmp": b"data"}),
        (8, "after", "rename", {"s": b"data"}),
    ],
)
def test_arm_crashes_at_the_exact_boundary(
    boundary: int, phase: str, kind: str, visible: dict[str, bytes]
) -> None:
    fs = FaultFS(ROOT)
    fs.arm(boundary)
    with fs, pytest.raises(SimulatedCrash) as info:
        atomic_save(fs, b"data")
    assert fs.crashed and fs.boundaries == boundary
    assert info.value.phase == phase and info.value.op.kind == kind
    assert fs.crash_point is not None and fs.crash_point[1:] == (phase, info.value.op)
    assert fs.tree() == visible
    assert fs.crash_image("process").tree() == visible


def test_arm_counts_from_now() -> None:
    fs = FaultFS(ROOT)
    with fs:
        atomic_save(fs, b"1")
        fs.arm(1)
        with pytest.raises(SimulatedCrash):
            atomic_save(fs, b"2")
    assert fs.boundaries == 11


def test_except_exception_cannot_swallow_the_crash() -> None:
    fs = FaultFS(ROOT)
    fs.arm(3)
    swallowed = False
    with fs, pytest.raises(SimulatedCrash):
        try:
            atomic_save(fs, b"x")
        except Exception:
            swallowed = True
    assert not swallowed


def test_the_crashed_process_is_frozen() -> None:
    fs = FaultFS(ROOT)
    fs.arm(4)
    with fs:
        with pytest.raises(SimulatedCrash):
            atomic_save(fs, b"x")
        before = fs.tree()
        for attempt in (
            lambda: os.write(next(iter(fs._fds)), b"more"),
            lambda: os.stat(fs.path("s.tmp")),
            lambda: open(fs.path("other"), "w"),
            lambda: os.unlink(fs.path("s.tmp")),
        ):
            with pytest.raises(IOAfterCrash):
                attempt()
        os.close(next(iter(fs._fds)))  # the kernel closes a dead process's files: allowed
    assert fs.tree() == before
    assert fs.io_after_crash == 4


def test_cleanup_in_a_with_block_surfaces_as_the_crash() -> None:
    """A buffered file flushed by __exit__ after the crash is refused, still a crash."""
    fs = FaultFS(ROOT)
    fs.arm(4)
    with fs, pytest.raises(SimulatedCrash):
        with open(fs.path("a"), "w") as first:  # boundaries 1, 2: create
            first.write("buffered, never flushed before the crash")
            os.mkdir(fs.path("d"))  # boundary 4: crash after mkdir
    assert fs.tree() == {"a": b"", "d": None}
    assert fs.io_after_crash >= 1  # TextIOWrapper and BufferedWriter each try to flush


def test_arm_and_disarm_validation() -> None:
    fs = FaultFS(ROOT)
    with pytest.raises(ConfigError):
        fs.arm(0)
    fs.arm(1)
    assert fs.armed
    fs.disarm()
    with fs:
        atomic_save(fs, b"x")
    assert not fs.crashed
    fs.arm(1)
    with fs, pytest.raises(SimulatedCrash):
        os.mkdir(fs.path("z"))
    with pytest.raises(ConfigError, match="already crashed"):
        fs.arm(1)


def test_a_crash_image_can_itself_be_armed_and_crashed() -> None:
    fs = FaultFS(ROOT)
    fs.arm(9)  # before the directory fsync
    with fs, pytest.raises(SimulatedCrash):
        atomic_save(fs, b"one")
    image = fs.crash_image("process")
    assert image.boundaries == 0 and not image.crashed
    image.arm(2)
    with image, pytest.raises(SimulatedCrash):
        atomic_save(image, b"two")
    assert image.crash_image("process").tree() == {"s": b"one", "s.tmp": b""}


def test_a_killed_programs_open_descriptors_do_not_keep_its_file_system_alive() -> None:
    """A crash kills the program: it never closes what it opened. Once nothing else holds
    that file system, it and its descriptors go (as a dead process's descriptors close),
    so a campaign of crashes does not keep every crashed model in memory."""
    import gc
    import weakref

    from faultfs._fdtable import FD_OWNERS, fd_owner

    fs = FaultFS("/leak")
    with fs:
        fd = os.open("/leak/f", os.O_WRONLY | os.O_CREAT, 0o600)
    fs.arm(1)
    with fs, pytest.raises(SimulatedCrash):
        while True:
            os.write(fd, b"x")
    assert fd_owner(fd) is fs  # still open, as the killed program left it
    image = fs.crash_image("process")
    gone = weakref.ref(fs)
    del fs
    gc.collect()
    assert gone() is None, "the crashed file system is still held"
    assert fd not in FD_OWNERS and fd_owner(fd) is None
    with image:  # the image is a new disk: the dead program's descriptor is not in it
        with pytest.raises(OSError):
            os.write(fd, b"y")
