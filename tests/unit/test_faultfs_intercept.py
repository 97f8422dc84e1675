"""Interception: unmodified os/open/pathlib/shutil code under the root reaches the model."""

from __future__ import annotations

import builtins
import fcntl
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from faultfs import FaultFS, OutsideRootError, UnsupportedOperation
from faultfs._syscalls import EPOCH_NS
from faultfs.errors import ConfigError

ROOT = "/faultfs-test-root"


@pytest.fixture
def fs() -> FaultFS:
    with FaultFS(ROOT) as fs:
        yield fs


def test_nothing_reaches_the_real_disk(fs: FaultFS) -> None:
    with open(fs.path("a.txt"), "w") as handle:
        handle.write("hello")
    assert fs.tree() == {"a.txt": b"hello"}
    fs.__exit__()
    try:
        assert not os.path.exists(ROOT)
    finally:
        fs.__enter__()


@pytest.mark.parametrize(
    ("mode", "initial", "payload", "expected"),
    [
        ("wb", b"old", b"new", b"new"),
        ("ab", b"old", b"+", b"old+"),
        ("w", b"old", "txt", b"txt"),
        ("a", b"old", "+", b"old+"),
        ("r+b", b"old", b"N", b"Nld"),
    ],
)
def test_open_write_modes(
    fs: FaultFS, mode: str, initial: bytes, payload: object, expected: bytes
) -> None:
    path = fs.path("f")
    with open(path, "wb") as handle:
        handle.write(initial)
    with open(path, mode) as handle:
        handle.write(payload)
    assert fs.read_file("f") == expected


def test_open_read_modes_and_iteration(fs: FaultFS) -> None:
    path = fs.path("lines.txt")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("één\ntwo\nthree")
    with open(path, "rb") as handle:
        assert handle.read() == "één\ntwo\nthree".encode()
    with open(path, encoding="utf-8") as handle:
        assert handle.readline() == "één\n"
        assert list(handle) == ["two\n", "three"]
    with io.open(path, "r", encoding="utf-8") as handle:  # noqa: UP020 - io.open is patched too
        assert handle.read(3) == "één"
    with open(path, "rb", buffering=0) as raw:
        assert raw.read(2) == b"\xc3\xa9"


def test_open_x_mode_and_missing_file(fs: FaultFS) -> None:
    with open(fs.path("x"), "x") as handle:
        handle.write("1")
    with pytest.raises(FileExistsError):
        open(fs.path("x"), "x")
    with pytest.raises(FileNotFoundError):
        open(fs.path("missing"))
    with pytest.raises(IsADirectoryError):
        open(fs.root)


def test_json_dump_and_fdopen(fs: FaultFS) -> None:
    fd = os.open(fs.path("c.json"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as handle:
        json.dump({"k": [1, 2]}, handle)
    with open(fs.path("c.json")) as handle:
        assert json.load(handle) == {"k": [1, 2]}


def test_pathlib(fs: FaultFS) -> None:
    base = Path(fs.root) / "p"
    base.mkdir()
    (base / "sub").mkdir(parents=True)
    target = base / "t.txt"
    target.write_text("text")
    (base / "b.bin").write_bytes(b"\x00\x01")
    assert target.exists() and target.is_file() and not target.is_dir()
    assert base.is_dir()
    assert target.read_text() == "text"
    assert (base / "b.bin").read_bytes() == b"\x00\x01"
    assert target.stat().st_size == 4
    assert sorted(p.name for p in base.iterdir()) == ["b.bin", "sub", "t.txt"]
    moved = target.rename(base / "u.txt")
    moved.replace(base / "v.txt")
    assert sorted(p.name for p in base.glob("*.txt")) == ["v.txt"]
    with (base / "v.txt").open("a") as handle:
        handle.write("!")
    assert (base / "v.txt").read_text() == "text!"
    (base / "v.txt").unlink()
    (base / "touched").touch()
    assert (base / "touched").exists()
    assert not (base / "v.txt").exists()


def test_shutil_copy_move_rmtree(fs: FaultFS) -> None:
    os.makedirs(fs.path("d", "e"))
    with open(fs.path("d", "e", "f"), "wb") as handle:
        handle.write(b"data")
    shutil.copy(fs.path("d", "e", "f"), fs.path("d", "g"))
    shutil.copy2(fs.path("d", "g"), fs.path("d", "h"))
    shutil.move(fs.path("d", "h"), fs.path("moved"))
    shutil.copytree(fs.path("d"), fs.path("d2"))
    assert fs.read_file("moved") == b"data"
    assert fs.read_file("d2/e/f") == b"data"
    shutil.rmtree(fs.path("d"))
    assert sorted(fs.tree()) == ["d2", "d2/e", "d2/e/f", "d2/g", "moved"]


def test_os_walk_scandir_listdir(fs: FaultFS) -> None:
    os.makedirs(fs.path("a", "b"))
    open(fs.path("a", "f"), "w").close()
    walked = [(d, sorted(ds), sorted(fs_)) for d, ds, fs_ in os.walk(fs.path("a"))]
    assert walked == [(fs.path("a"), ["b"], ["f"]), (fs.path("a", "b"), [], [])]
    with os.scandir(fs.path("a")) as entries:
        info = {e.name: (e.is_dir(), e.is_file(), e.path) for e in entries}
    assert info == {"b": (True, False, fs.path("a", "b")), "f": (False, True, fs.path("a", "f"))}
    assert os.listdir(fs.path("a").encode()) == [b"b", b"f"]


def test_directory_descriptors_fsync_and_reject_writes(fs: FaultFS) -> None:
    fd = os.open(fs.root, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    with pytest.raises(IsADirectoryError):
        os.write(fd, b"x")
    os.close(fd)
    with pytest.raises(IsADirectoryError):
        os.open(fs.root, os.O_WRONLY)
    open(fs.path("file"), "w").close()
    with pytest.raises(NotADirectoryError):
        os.open(fs.path("file"), os.O_RDONLY | os.O_DIRECTORY)


def test_relative_paths_use_the_real_cwd(
    fs: FaultFS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a real directory, outside the root: passes through
    with open("real.txt", "w") as handle:
        handle.write("real")
    assert (tmp_path / "real.txt").exists()
    assert "real.txt" not in fs.tree()
    # ".." segments are normalised before routing.
    with open(fs.path("x", "..", "y"), "w") as handle:
        handle.write("y")
    assert fs.tree() == {"y": b"y"}


def test_outside_paths_pass_through_by_default(fs: FaultFS, tmp_path: Path) -> None:
    real = tmp_path / "real.bin"
    real.write_bytes(b"r")
    fd = os.open(real, os.O_RDONLY)
    assert os.read(fd, 5) == b"r"
    os.fsync(fd)
    os.close(fd)
    assert os.path.isfile(real)


def test_refuse_outside(tmp_path: Path) -> None:
    with FaultFS(ROOT, outside="refuse") as fs:
        with pytest.raises(OutsideRootError, match="outside the faultfs root"):
            open(tmp_path / "x", "w")
        with pytest.raises(OutsideRootError):
            os.stat(tmp_path)
        os.mkdir(fs.path("inside"))


def test_cross_boundary_rename_is_exdev_and_move_copies(fs: FaultFS, tmp_path: Path) -> None:
    real = tmp_path / "r"
    real.write_text("r")
    with pytest.raises(OSError) as info:
        os.rename(real, fs.path("r"))
    assert info.value.errno == 18  # EXDEV
    shutil.move(str(real), fs.path("r"))
    assert fs.read_file("r") == b"r" and not real.exists()


def test_nesting_and_restoring_the_originals() -> None:
    real_open, real_fsync = builtins.open, os.fsync
    outer = FaultFS("/faultfs-outer")
    inner = FaultFS("/faultfs-outer/inner")
    with outer:
        os.mkdir(outer.path("inner"))
        with inner:
            with open(inner.path("f"), "w") as handle:
                handle.write("inner")
            with open(outer.path("g"), "w") as handle:
                handle.write("outer")
        assert builtins.open is not real_open
    assert builtins.open is real_open and os.fsync is real_fsync
    assert inner.tree() == {"f": b"inner"}
    assert outer.tree() == {"g": b"outer", "inner": None}
    with outer, pytest.raises(ConfigError):
        outer.__enter__()


def test_flock_between_descriptions(fs: FaultFS) -> None:
    a = os.open(fs.path("lock"), os.O_RDWR | os.O_CREAT)
    b = os.open(fs.path("lock"), os.O_RDWR)
    fcntl.flock(a, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with pytest.raises(BlockingIOError):
        fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.flock(a, fcntl.LOCK_UN)
    fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(b)
    fcntl.flock(a, fcntl.LOCK_SH | fcntl.LOCK_NB)
    os.close(a)


def test_tempfile_under_the_root(fs: FaultFS) -> None:
    fd, name = tempfile.mkstemp(dir=fs.root, suffix=".tmp")
    os.write(fd, b"t")
    os.close(fd)
    assert name.startswith(fs.root + "/")
    with tempfile.NamedTemporaryFile(dir=fs.root, delete=False) as handle:
        handle.write(b"n")
    assert fs.read_file(os.path.basename(handle.name)) == b"n"


def test_symlinks_are_refused_clearly(fs: FaultFS) -> None:
    with pytest.raises(UnsupportedOperation, match="symbolic links"):
        os.symlink("target", fs.path("link"))


def test_root_validation() -> None:
    with pytest.raises(ConfigError, match="absolute"):
        FaultFS("relative/root")
    with pytest.raises(ConfigError, match="'/'"):
        FaultFS("/")
    with pytest.raises(ConfigError, match="profile"):
        FaultFS("/x", profile="zfs")
    with pytest.raises(ConfigError, match="outside"):
        FaultFS("/x", outside="maybe")


def _stats_after_the_same_work(root: str) -> list[tuple[int, ...]]:
    with FaultFS(root) as fs:
        os.makedirs(fs.path("d"))
        with open(fs.path("d/a"), "w") as handle:
            handle.write("one")
        first = os.stat(fs.path("d/a"))
        with open(fs.path("d/a"), "a") as handle:
            handle.write("two")
        os.utime(fs.path("d"))
        out = [first, os.stat(fs.path("d/a")), os.stat(fs.path("d"))]
        return [(s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns) for s in out]


def test_file_times_follow_the_operations_not_the_wall_clock() -> None:
    # A disk image that holds file fingerprints (substrat's start summary) must come out the
    # same byte for byte however often, and in which process, the same work reaches it.
    first = _stats_after_the_same_work(ROOT)
    assert _stats_after_the_same_work(ROOT) == first
    (_, ino, _, written, changed), (_, same_ino, _, appended, _), (_, _, _, touched, _) = first
    assert ino == same_ino and written == changed
    assert written < appended < touched, "each operation moves the files' clock on"
    assert EPOCH_NS < written < EPOCH_NS + 10**9, "the model's clock, not the wall clock"
