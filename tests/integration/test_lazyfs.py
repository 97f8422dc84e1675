"""The LazyFS driver against a real LazyFS mount (skipped, saying how to get it, when absent).

The first group needs no LazyFS: it checks what the driver writes (config,
FIFO commands) and how it reports a missing binary.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import stat
import subprocess
import threading
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from faultfs.lazyfs import (
    HOW_TO_GET_FUSE,
    HOW_TO_GET_LAZYFS,
    LAZYFS_BIN_ENV,
    MAX_FIFO_COMMAND_BYTES,
    LazyFS,
    LazyFSError,
    LazyFSUnavailable,
    crash_command,
    find_lazyfs,
    fuse_device_problem,
    fuse_mounted_at,
    render_config,
    require_lazyfs,
)

CACHE_BYTES = 8 * 1024 * 1024
TIMEOUT_S = 15.0

# -- without LazyFS --------------------------------------------------------------


def test_config_is_valid_toml_with_the_keys_lazyfs_reads(tmp_path: Path) -> None:
    weird = str(tmp_path / 'we"ird\\dir')
    text = render_config(
        fifo_path=weird + "/f.fifo",
        completed_fifo_path="/x/done.fifo",
        cache_size_bytes=3 * 1024 * 1024,
        log_file="/x/log",
    )
    parsed = tomllib.loads(text)
    assert parsed["faults"] == {
        "fifo_path": weird + "/f.fifo",
        "fifo_path_completed": "/x/done.fifo",
    }
    assert parsed["cache"]["apply_eviction"] is False
    assert parsed["cache"]["simple"] == {"custom_size": "3072kb", "blocks_per_page": 1}
    assert parsed["filesystem"] == {"log_all_operations": False, "logfile": "/x/log"}


@pytest.mark.parametrize("size", [0, 1024, 1024 * 1024 + 1, 32 * 1024**3])
def test_bad_cache_sizes_are_refused(size: int) -> None:
    with pytest.raises(ValueError, match="cache_size_bytes"):
        render_config(
            fifo_path="/f", completed_fifo_path="/d", cache_size_bytes=size, log_file="/l"
        )


def test_crash_commands_follow_lazyfs_syntax() -> None:
    assert (
        crash_command(op="fsync", timing="before", from_regex="events")
        == "lazyfs::crash::timing=before::op=fsync::from_rgx=events"
    )
    assert (
        crash_command(op="rename", timing="after", to_regex="session")
        == "lazyfs::crash::timing=after::op=rename::from_rgx=.*::to_rgx=session"
    )
    assert (
        crash_command(op="link", from_regex="a", to_regex="b")
        == "lazyfs::crash::timing=before::op=link::from_rgx=(?:a|^none$)::to_rgx=b"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"op": "mkdir", "from_regex": "x"}, "not one LazyFS can crash on"),
        ({"op": "write", "timing": "during", "from_regex": "x"}, "before' or 'after"),
        ({"op": "write"}, "needs from_regex"),
        ({"op": "write", "from_regex": "a", "to_regex": "b"}, "to_regex only applies"),
        ({"op": "rename"}, "needs from_regex, to_regex or both"),
        ({"op": "write", "from_regex": "a::b"}, "may not contain"),
        ({"op": "write", "from_regex": ""}, "must not be empty"),
        ({"op": "write", "from_regex": "x" * MAX_FIFO_COMMAND_BYTES}, "shorten the regexes"),
    ],
)
def test_bad_crash_requests_are_refused_before_reaching_lazyfs(
    kwargs: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        crash_command(**kwargs)


def test_lazyfs_bin_wins_over_path(tmp_path: Path) -> None:
    fake = tmp_path / "my-lazyfs"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "lazyfs").write_text("#!/bin/sh\n")
    (on_path / "lazyfs").chmod(0o755)
    assert find_lazyfs({LAZYFS_BIN_ENV: str(fake), "PATH": str(on_path)}) == str(fake)
    assert find_lazyfs({"PATH": str(on_path)}) == str(on_path / "lazyfs")
    assert find_lazyfs({"PATH": str(tmp_path / "nowhere")}) is None


def test_missing_lazyfs_error_says_how_to_get_it(tmp_path: Path) -> None:
    not_executable = tmp_path / "lazyfs"
    not_executable.write_text("")
    with pytest.raises(LazyFSUnavailable) as info:
        require_lazyfs({LAZYFS_BIN_ENV: str(not_executable), "PATH": ""})
    message = str(info.value)
    assert "is not an executable file" in message
    assert HOW_TO_GET_LAZYFS in message
    assert "LAZYFS_BIN" in message and "docs/lazyfs.md" in message
    assert find_lazyfs({LAZYFS_BIN_ENV: str(not_executable)}) is None


def test_a_fuse_device_lazyfs_cannot_use_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "fuse"
    expected = f"{missing} does not exist (FUSE is not usable here)"
    assert fuse_device_problem(str(missing)) == expected
    missing.write_text("")
    assert "is not a character device" in (fuse_device_problem(str(missing)) or "")
    assert fuse_device_problem("/dev/null") is None  # a character device this user may open
    # The advice for a FUSE problem is about FUSE, not about building LazyFS again.
    message = str(LazyFSUnavailable("x", HOW_TO_GET_FUSE))
    assert "/dev/fuse" in message and HOW_TO_GET_LAZYFS not in message


def test_driver_refuses_bad_directories(tmp_path: Path) -> None:
    fake = tmp_path / "lazyfs"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    with pytest.raises(ValueError, match="not an existing directory"):
        LazyFS(tmp_path / "missing", tmp_path, binary=str(fake))
    with pytest.raises(ValueError, match="must be different"):
        LazyFS(tmp_path, tmp_path, binary=str(fake))
    comma = tmp_path / "a,b"
    comma.mkdir()
    with pytest.raises(ValueError, match="comma"):
        LazyFS(tmp_path, comma, binary=str(fake))
    with pytest.raises(LazyFSUnavailable, match=r"docs/lazyfs\.md"):
        LazyFS(tmp_path / "a,b", tmp_path, binary=str(tmp_path / "nope"))


def test_a_binary_that_exits_at_once_is_reported_with_its_output(tmp_path: Path) -> None:
    fake = tmp_path / "lazyfs"
    fake.write_text("#!/bin/sh\necho 'fuse: device not found' >&2\nexit 1\n")
    fake.chmod(0o755)
    (tmp_path / "m").mkdir()
    (tmp_path / "b").mkdir()
    fs = LazyFS(tmp_path / "m", tmp_path / "b", binary=str(fake), fifo_dir=tmp_path / "ctl")
    with pytest.raises(LazyFSError, match="fuse: device not found"):
        fs.mount(timeout_s=TIMEOUT_S)
    assert not fs.running
    fs.unmount()


class _OldLazyFS:
    """An old LazyFS's fault worker, without FUSE: a live process, the real FIFOs, its log.

    It reads each command from the fault FIFO and logs what that LazyFS version
    logged (``answer``), and never writes to the completion FIFO.
    """

    def __init__(self, tmp_path: Path, answer: Callable[[str], str]) -> None:
        fake = tmp_path / "lazyfs"
        fake.write_text("#!/bin/sh\n")
        fake.chmod(0o755)
        for name in ("m", "b"):
            (tmp_path / name).mkdir()
        self.fs = LazyFS(tmp_path / "m", tmp_path / "b", binary=str(fake), fifo_dir=tmp_path / "c")
        self.fs._prepare_control_files()
        self.fs._proc = subprocess.Popen(["sleep", "60"])
        self._reader = os.open(self.fs.fifo_path, os.O_RDWR | os.O_NONBLOCK)  # never at EOF
        self._answer = answer
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._serve, daemon=True)
        self._worker.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not select.select([self._reader], [], [], 0.05)[0]:
                continue
            command = os.read(self._reader, 100).decode().strip()
            if not command:
                continue  # the driver closed its end after writing
            with open(self.fs.log_file, "a") as log:
                log.write(f"[info] [lazyfs.faults.worker]: {self._answer(command)}\n")

    def close(self) -> None:
        self._stop.set()
        self._worker.join()
        assert self.fs._proc is not None
        self.fs._proc.kill()
        self.fs._proc.wait()
        self.fs._forget_process()
        os.close(self._reader)


def test_a_lazyfs_without_crash_faults_is_named_too_old(tmp_path: Path) -> None:
    """LazyFS 0.2.0 logs 'command unknown' at once; waiting 15 s for nothing said less."""
    old = _OldLazyFS(tmp_path, lambda command: f"command unknown '{command}'")
    try:
        with pytest.raises(LazyFSError) as info:
            old.fs.crash(op="fsync", from_regex="x", timeout_s=TIMEOUT_S)
        assert "does not know crash faults" in str(info.value)
        assert "older than 0.3.0" in str(info.value) and "docs/lazyfs.md" in str(info.value)
    finally:
        old.close()


def test_a_lazyfs_that_does_not_confirm_clear_cache_is_named_too_old(tmp_path: Path) -> None:
    """LazyFS 0.1.0 clears its cache but has no completion FIFO to say so."""
    old = _OldLazyFS(tmp_path, lambda command: "[lazyfs.cmds]: cache is cleared.")
    try:
        with pytest.raises(LazyFSError, match=r"never confirmed it .* older than 0\.2\.0"):
            old.fs.clear_cache(timeout_s=1.0)
    finally:
        old.close()


# -- with a real LazyFS ----------------------------------------------------------


def _lazyfs_or_skip() -> str:
    try:
        return require_lazyfs()
    except LazyFSUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def lazyfs(tmp_path: Path) -> Iterator[LazyFS]:
    binary = _lazyfs_or_skip()
    (tmp_path / "mnt").mkdir()
    (tmp_path / "backing").mkdir()
    fs = LazyFS(
        tmp_path / "mnt",
        tmp_path / "backing",
        binary=binary,
        cache_size_bytes=CACHE_BYTES,
        fifo_dir=tmp_path / "ctl",
    )
    fs.mount(timeout_s=TIMEOUT_S)
    try:
        yield fs
    finally:
        fs.unmount(timeout_s=TIMEOUT_S)
        assert not fuse_mounted_at(fs.mount_dir)


def _write(path: Path, data: bytes, *, fsync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _mnt(fs: LazyFS) -> Path:
    return Path(fs.mount_dir)


def _backing(fs: LazyFS) -> Path:
    return Path(fs.backing_dir)


def test_mount_is_live_and_shows_the_backing_directory(lazyfs: LazyFS) -> None:
    assert fuse_mounted_at(lazyfs.mount_dir)
    (_backing(lazyfs) / "already-there").write_bytes(b"x")
    assert (_mnt(lazyfs) / "already-there").read_bytes() == b"x"
    assert stat.S_ISFIFO(os.stat(lazyfs.fifo_path).st_mode)


def test_clear_cache_loses_unsynced_data_and_keeps_synced(lazyfs: LazyFS) -> None:
    _write(_mnt(lazyfs) / "synced", b"durable bytes", fsync=True)
    _write(_mnt(lazyfs) / "unsynced", b"volatile bytes", fsync=False)
    # Before the power loss the program sees both; the disk has only the synced one.
    assert (_mnt(lazyfs) / "unsynced").read_bytes() == b"volatile bytes"
    assert (_backing(lazyfs) / "unsynced").read_bytes() == b""
    lazyfs.clear_cache(timeout_s=TIMEOUT_S)
    assert (_mnt(lazyfs) / "synced").read_bytes() == b"durable bytes"
    assert (_mnt(lazyfs) / "unsynced").read_bytes() == b""
    lazyfs.remount(timeout_s=TIMEOUT_S)
    assert (_mnt(lazyfs) / "synced").read_bytes() == b"durable bytes"
    assert (_mnt(lazyfs) / "unsynced").read_bytes() == b""


def test_an_append_after_fsync_is_lost_but_the_fsynced_prefix_stays(lazyfs: LazyFS) -> None:
    path = _mnt(lazyfs) / "log"
    with open(path, "ab") as fh:
        fh.write(b"one\n")
        fh.flush()
        os.fsync(fh.fileno())
        fh.write(b"two\n")
    lazyfs.clear_cache(timeout_s=TIMEOUT_S)
    assert path.read_bytes() == b"one\n"


def test_checkpoint_writes_the_cache_through_to_the_backing_files(lazyfs: LazyFS) -> None:
    _write(_mnt(lazyfs) / "f", b"checkpointed", fsync=False)
    assert (_backing(lazyfs) / "f").read_bytes() == b""
    lazyfs.checkpoint(timeout_s=TIMEOUT_S)
    assert (_backing(lazyfs) / "f").read_bytes() == b"checkpointed"
    lazyfs.clear_cache(timeout_s=TIMEOUT_S)
    assert (_mnt(lazyfs) / "f").read_bytes() == b"checkpointed"


def test_crash_before_fsync_kills_the_mount_and_remount_recovers(lazyfs: LazyFS) -> None:
    _write(_mnt(lazyfs) / "kept", b"synced earlier", fsync=True)
    lazyfs.crash(op="fsync", timing="before", from_regex="victim", timeout_s=TIMEOUT_S)
    # Operations on other files do not trigger it.
    _write(_mnt(lazyfs) / "bystander", b"b", fsync=True)
    assert lazyfs.running
    with pytest.raises(OSError) as info:
        _write(_mnt(lazyfs) / "victim", b"never durable", fsync=True)
    assert info.value.errno in (errno.ECONNABORTED, errno.ENOTCONN)
    lazyfs.wait_crashed(timeout_s=TIMEOUT_S)
    assert lazyfs.crashed
    with pytest.raises(OSError):
        os.listdir(lazyfs.mount_dir)
    with pytest.raises(LazyFSError, match="not running"):
        lazyfs.clear_cache(timeout_s=TIMEOUT_S)
    lazyfs.remount(timeout_s=TIMEOUT_S)
    assert lazyfs.running
    assert (_mnt(lazyfs) / "kept").read_bytes() == b"synced earlier"
    assert (_mnt(lazyfs) / "bystander").read_bytes() == b"b"
    assert (_mnt(lazyfs) / "victim").read_bytes() == b""
    _write(_mnt(lazyfs) / "after", b"works again", fsync=True)
    assert (_backing(lazyfs) / "after").read_bytes() == b"works again"


def test_crash_after_a_write_loses_that_write(lazyfs: LazyFS) -> None:
    lazyfs.crash(op="write", timing="after", from_regex="w-target", timeout_s=TIMEOUT_S)
    with pytest.raises(OSError):
        _write(_mnt(lazyfs) / "w-target", b"acknowledged by the kernel only", fsync=False)
    lazyfs.wait_crashed(timeout_s=TIMEOUT_S)
    lazyfs.remount(timeout_s=TIMEOUT_S)
    assert (_mnt(lazyfs) / "w-target").read_bytes() == b""


def test_rename_crash_honours_both_source_and_target_patterns(lazyfs: LazyFS) -> None:
    for name in ("src-a", "src-b", "src-b2"):
        _write(_mnt(lazyfs) / name, b"x", fsync=True)
    lazyfs.crash(op="rename", from_regex="src-b", to_regex="dst", timeout_s=TIMEOUT_S)
    os.rename(_mnt(lazyfs) / "src-a", _mnt(lazyfs) / "dst-a")  # source does not match
    os.rename(_mnt(lazyfs) / "src-b", _mnt(lazyfs) / "other")  # target does not match
    assert lazyfs.running
    with pytest.raises(OSError):
        os.rename(_mnt(lazyfs) / "src-b2", _mnt(lazyfs) / "dst-b")
    lazyfs.wait_crashed(timeout_s=TIMEOUT_S)
    lazyfs.remount(timeout_s=TIMEOUT_S)
    assert sorted(os.listdir(lazyfs.mount_dir)) == ["dst-a", "other", "src-b2"]


def test_blind_spot_names_are_durable_without_a_directory_fsync(lazyfs: LazyFS) -> None:
    """LazyFS applies creates and renames to the backing directory at once.

    A real power loss could drop both names here (no directory fsync). LazyFS
    keeps them, which is why faultfs's ``posix`` profile is needed to catch a
    missing directory fsync (docs/lazyfs.md).
    """
    _write(_mnt(lazyfs) / "tmp", b"content", fsync=True)
    os.rename(_mnt(lazyfs) / "tmp", _mnt(lazyfs) / "final")
    _write(_mnt(lazyfs) / "new-file", b"", fsync=False)
    lazyfs.clear_cache(timeout_s=TIMEOUT_S)
    lazyfs.remount(timeout_s=TIMEOUT_S)
    assert (_mnt(lazyfs) / "final").read_bytes() == b"content"
    assert (_mnt(lazyfs) / "new-file").exists()
    assert not (_mnt(lazyfs) / "tmp").exists()


def test_teardown_drops_unsynced_data_and_stops_lazyfs(tmp_path: Path) -> None:
    binary = _lazyfs_or_skip()
    mnt, backing = tmp_path / "mnt", tmp_path / "backing"
    mnt.mkdir()
    backing.mkdir()
    with LazyFS(mnt, backing, binary=binary, cache_size_bytes=CACHE_BYTES) as fs:
        pid = fs.pid
        control_dir = fs.fifo_dir
        _write(mnt / "synced", b"s", fsync=True)
        _write(mnt / "unsynced", b"u", fsync=False)
    assert pid is not None and not Path(f"/proc/{pid}").exists()
    assert not fuse_mounted_at(str(mnt))
    assert not Path(control_dir).exists()
    assert (backing / "synced").read_bytes() == b"s"
    assert (backing / "unsynced").read_bytes() == b""


def test_mounting_over_a_live_mount_is_refused(lazyfs: LazyFS, tmp_path: Path) -> None:
    second = LazyFS(lazyfs.mount_dir, tmp_path, binary=lazyfs.binary, fifo_dir=tmp_path / "c2")
    with pytest.raises(LazyFSError, match="already a mount point"):
        second.mount(timeout_s=TIMEOUT_S)
    with pytest.raises(LazyFSError, match="already mounted by this object"):
        lazyfs.mount(timeout_s=TIMEOUT_S)


def test_a_dead_mount_left_by_a_killed_lazyfs_is_named(lazyfs: LazyFS) -> None:
    assert lazyfs.pid is not None
    os.kill(lazyfs.pid, signal.SIGKILL)
    lazyfs.wait_crashed(timeout_s=TIMEOUT_S)
    with pytest.raises(OSError) as dead:
        os.listdir(lazyfs.mount_dir)
    assert dead.value.errno == errno.ENOTCONN
    with pytest.raises(LazyFSError, match="is a dead FUSE mount") as info:
        LazyFS(lazyfs.mount_dir, lazyfs.backing_dir, binary=lazyfs.binary)
    assert f"fusermount3 -uz {lazyfs.mount_dir}" in str(info.value)
    lazyfs.remount(timeout_s=TIMEOUT_S)  # the fixture's object brings it back and tears it down
