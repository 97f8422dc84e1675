"""io.FileIO called while a FaultFS is active opens a simulated file under its root.

Libraries stack their own buffers on a raw file: safer (PyPI) opens every file it
writes as ``io.FileIO(temp, "w")`` and wraps it in io.BufferedWriter and
io.TextIOWrapper. When faultfs refused io.FileIO with EscapeError, such a library
could not be crash-tested at all; now its writes reach the model and explore names
its missing fsyncs. Each behaviour below is compared with the real io.FileIO on a
real directory.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from faultfs import FaultFS, OutsideRootError, explore

MODES = ["w", "wb", "r", "rb", "r+", "w+", "a", "a+", "x", "x+"]


def _raw_stack_save(path: str, data: dict[str, int], *, durable: bool) -> None:
    """Write ``data`` as safer does: a temporary file through io.FileIO, then a rename."""
    tmp = path + ".tmp"
    raw = io.FileIO(tmp, "w")
    with io.TextIOWrapper(io.BufferedWriter(raw)) as f:
        json.dump(data, f)
        if durable:
            f.flush()
            os.fsync(raw.fileno())
    os.replace(tmp, path)
    if durable:
        fd = os.open(os.path.dirname(path), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def _session(base: str, mode: str) -> dict[str, Any]:
    """What a program sees through io.FileIO(base/f, mode) on a file holding b'old'."""
    path = os.path.join(base, "f")
    if not mode.startswith("x"):
        with open(path, "wb") as f:
            f.write(b"old")
    seen: dict[str, Any] = {}
    with io.FileIO(path, mode) as raw:
        seen["attrs"] = (raw.mode, raw.closefd, raw.name == path, raw.readable(), raw.writable())
        seen["tell"] = raw.tell()
        if raw.writable():
            raw.write(b"new")
        if raw.readable():
            raw.seek(0)
            seen["read"] = raw.read()
    with open(path, "rb") as f:
        seen["after"] = f.read()
    os.unlink(path)
    return seen


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_behaves_as_the_real_fileio(tmp_path: Path, mode: str) -> None:
    real = _session(str(tmp_path), mode)
    root = tmp_path / "sim"
    root.mkdir()
    with FaultFS(root, outside="refuse") as fs:
        simulated = _session(fs.root, mode)
        assert fs.escapes == []
    assert simulated == real
    assert list(root.iterdir()) == []  # everything stayed in the model


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("dir", "r"), IsADirectoryError),
        (("f", "rt"), ValueError),
        (("f", "rw"), ValueError),
        (("f", ""), ValueError),
        (("f", "r", False), ValueError),
        (("missing", "r"), FileNotFoundError),
        (("f", "x"), FileExistsError),
    ],
)
def test_bad_calls_fail_as_the_real_fileio(
    tmp_path: Path, args: tuple[Any, ...], error: type[Exception]
) -> None:
    def attempt(base: str) -> str:
        os.mkdir(os.path.join(base, "dir"))
        with open(os.path.join(base, "f"), "wb"):
            pass
        with pytest.raises(error) as info:
            io.FileIO(os.path.join(base, args[0]), *args[1:])
        return type(info.value).__name__ + str(info.value.args[:1])

    real = attempt(str(tmp_path))
    root = tmp_path / "sim"
    root.mkdir()
    with FaultFS(root, outside="refuse") as fs:
        assert attempt(fs.root) == real


def test_a_simulated_descriptor_and_isinstance(tmp_path: Path) -> None:
    real_file = tmp_path / "real"
    with FaultFS(tmp_path / "sim") as fs:  # passthrough: the real file stays reachable
        fd = os.open(fs.path("a"), os.O_WRONLY | os.O_CREAT, 0o644)
        raw = io.FileIO(fd, "w")
        assert (raw.name, raw.mode) == (fd, "wb")
        raw.write(b"by descriptor")
        raw.close()
        with pytest.raises(OSError):
            os.fstat(fd)  # closefd=True closed the simulated descriptor
        assert isinstance(raw, io.FileIO)
        with open(real_file, "wb") as f:  # the real one is still an io.FileIO
            assert isinstance(f.raw, io.FileIO)
        assert issubclass(type(f.raw), io.FileIO)
        with io.FileIO(real_file, "r") as outside:  # outside the root: the real file
            assert outside.read() == b""
        assert fs.tree() == {"a": b"by descriptor"}
    with open(real_file, "rb", buffering=0) as unbuffered:
        assert type(unbuffered) is io.FileIO  # restored


def test_paths_outside_the_root_are_refused(tmp_path: Path) -> None:
    with FaultFS(tmp_path / "sim", outside="refuse"), pytest.raises(OutsideRootError):
        io.FileIO(tmp_path / "log", "w")
    assert not (tmp_path / "log").exists()


def _explore_saver(durable: bool) -> Any:
    def workload(fs: FaultFS) -> None:
        for version in (1, 2):
            _raw_stack_save(fs.path("state.json"), {"v": version}, durable=durable)
            fs.ack(version)

    def check(img: FaultFS) -> None:
        with open(img.path("state.json")) as f:
            assert json.load(f)["v"] >= max(img.acked, default=0)

    def setup(fs: FaultFS) -> None:
        _raw_stack_save(fs.path("state.json"), {"v": 0}, durable=True)

    return explore(workload, check, setup=setup)


def test_explore_names_the_missing_fsyncs_of_a_raw_file_stack() -> None:
    report = _explore_saver(durable=False)
    causes = {c.kind: c for c in report.causes()}
    assert set(causes) == {"unsynced-before-rename", "entry-not-durable"}, str(report)
    # the data was written through the raw file this module opened with io.FileIO
    write = next(s for s in causes["unsynced-before-rename"].steps if s.role == "write")
    assert any(frame.file.endswith("test_faultfs_fileio.py") for frame in write.frames)
    assert _explore_saver(durable=True).ok


def test_a_subclass_made_during_the_run_is_a_real_class(tmp_path: Path) -> None:
    with FaultFS(tmp_path / "sim"):

        class Logged(io.FileIO):
            pass

        with Logged(tmp_path / "real", "w") as raw:  # outside the root: a real file
            raw.write(b"x")
            assert isinstance(raw, Logged) and isinstance(raw, io.FileIO)
        with open(tmp_path / "real", "rb") as f:
            assert not isinstance(f.raw, Logged)
    assert (tmp_path / "real").read_bytes() == b"x"
