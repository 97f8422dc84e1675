"""os's other descriptor calls on a simulated descriptor: modelled, or refused by name.

They used to reach the real kernel and fail with a bare EBADF, which a library
may swallow and fall back from (testing the fallback), or drop a write unseen.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from faultfs import FaultFS, explore
from faultfs.errors import EscapeError, ExploreFailed

ROOT = "/faultfs-fdcalls"


@pytest.fixture
def fs() -> Iterator[FaultFS]:
    with FaultFS(ROOT) as fs:
        yield fs


def _open(fs: FaultFS, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    return os.open(fs.path("f"), flags, 0o644)


def test_writev_and_pwritev_are_writes(fs: FaultFS) -> None:
    fd = _open(fs)
    before = fs.boundaries
    assert os.writev(fd, [b"ab", bytearray(b"cd"), memoryview(b"ef")]) == 6
    assert os.pwritev(fd, [b"XY", b"Z"], 1) == 3
    assert fs.boundaries - before == 4  # one write each: before and after
    assert os.pread(fd, 10, 0) == b"aXYZef"
    buffers = [bytearray(2), bytearray(3)]
    assert os.preadv(fd, buffers, 1) == 5
    assert buffers == [bytearray(b"XY"), bytearray(b"Zef")]
    os.lseek(fd, 0, os.SEEK_SET)
    assert os.readv(fd, [bytearray(4)]) == 4
    os.close(fd)


def test_dup_shares_the_open_file_description(fs: FaultFS) -> None:
    fd = _open(fs)
    twin = os.dup(fd)
    assert twin != fd
    os.write(fd, b"ab")
    os.write(twin, b"cd")  # the offset is shared
    os.close(fd)
    with os.fdopen(twin, "rb") as f:
        f.seek(0)
        assert f.read() == b"abcd"
    assert fs.tree() == {"f": b"abcd"}


def test_descriptor_and_status_flags(fs: FaultFS) -> None:
    fd = _open(fs, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    assert not os.get_inheritable(fd)
    os.set_inheritable(fd, True)
    assert os.get_inheritable(fd) and not fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    assert fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC) == 0
    assert not os.get_inheritable(fd)
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    assert flags & os.O_ACCMODE == os.O_WRONLY and flags & os.O_APPEND
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_APPEND)
    os.write(fd, b"abc")
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, b"X")  # no longer appending
    assert fs.tree() == {"f": b"Xbc"}
    assert os.get_blocking(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # a hint: nothing to model
    os.close(fd)


def test_the_same_flags_as_a_real_descriptor(fs: FaultFS, tmp_path: object) -> None:
    real = os.open(os.path.join(str(tmp_path), "f"), os.O_RDWR | os.O_CREAT | os.O_APPEND)
    fake = _open(fs, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    try:
        assert fcntl.fcntl(fake, fcntl.F_GETFL) == fcntl.fcntl(real, fcntl.F_GETFL)
        assert fcntl.fcntl(fake, fcntl.F_GETFD) == fcntl.fcntl(real, fcntl.F_GETFD)
    finally:
        os.close(real)
        os.close(fake)


def test_posix_fallocate_sets_the_size_and_fstatvfs_answers(fs: FaultFS) -> None:
    fd = _open(fs)
    os.write(fd, b"ab")
    os.posix_fallocate(fd, 0, 1)  # inside the file: nothing changes
    os.posix_fallocate(fd, 2, 4)
    assert fs.tree() == {"f": b"ab\0\0\0\0"}
    assert os.fstatvfs(fd).f_bsize > 0
    assert os.statvfs(fs.path("f")).f_bsize > 0
    with pytest.raises(FileNotFoundError):
        os.statvfs(fs.path("missing"))
    os.close(fd)


@pytest.mark.parametrize(
    "call",
    ["fchown", "lockf", "sendfile", "copy_file_range", "fcntl_setlk", "dup2"],
)
def test_unmodelled_calls_stop_with_an_explanation_that_cannot_be_swallowed(
    fs: FaultFS, call: str
) -> None:
    fd = _open(fs)
    out = os.open(os.devnull, os.O_WRONLY)
    calls = {
        "fchown": lambda: os.fchown(fd, os.getuid(), os.getgid()),
        "lockf": lambda: os.lockf(fd, os.F_LOCK, 0),
        "sendfile": lambda: os.sendfile(out, fd, 0, 1),
        "copy_file_range": lambda: os.copy_file_range(fd, out, 1),
        "fcntl_setlk": lambda: fcntl.fcntl(fd, fcntl.F_SETLK, b"\0" * 32),
        "dup2": lambda: os.dup2(fd, out),
    }
    try:
        with pytest.raises(EscapeError, match="faultfs does not model it") as caught:
            try:
                calls[call]()
            except OSError:  # what a library's fallback catches: not this
                pytest.fail("an OSError a library would swallow")
        assert not isinstance(caught.value, OSError)
        assert fs.escapes and "FaultFS root" in fs.escapes[-1]
    finally:
        os.close(out)
        os.close(fd)


def test_a_swallowed_refusal_still_fails_explore() -> None:
    def workload(fs: FaultFS) -> None:
        fd = os.open(fs.path("f"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.fchown(fd, os.getuid(), os.getgid())
        except Exception:  # the library under test swallows everything
            pass
        os.write(fd, b"x")
        os.fsync(fd)
        os.close(fd)
        fs.ack(1)

    with pytest.raises((EscapeError, ExploreFailed), match="fchown"):
        explore(workload, lambda img: None, root=ROOT, modes="process").assert_ok()


def test_real_descriptors_are_untouched(fs: FaultFS, tmp_path: object) -> None:
    fd = os.open(os.path.join(str(tmp_path), "r"), os.O_RDWR | os.O_CREAT)
    assert os.writev(fd, [b"ab"]) == 2
    twin = os.dup(fd)
    assert fcntl.fcntl(twin, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    os.close(twin)
    os.close(fd)


def test_mmap_imported_inside_the_run_is_checked() -> None:
    """mmap loaded only after activation used to give a bare EBADF: faultfs loads it first."""
    code = (
        "import sys, os\n"
        "assert 'mmap' not in sys.modules\n"
        "from faultfs import FaultFS\n"
        "from faultfs.errors import EscapeError\n"
        "with FaultFS('/faultfs-mmap-late') as fs:\n"
        "    fd = os.open(fs.path('f'), os.O_RDWR | os.O_CREAT)\n"
        "    os.write(fd, b'x' * 10)\n"
        "    import mmap\n"
        "    try:\n"
        "        mmap.mmap(fd, 10)\n"
        "    except EscapeError as e:\n"
        "        print('refused:', 'mmap.mmap of' in str(e))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.stdout.strip() == "refused: True", out.stderr
