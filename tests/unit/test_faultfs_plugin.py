"""The pytest plugin: the faultfs fixture, its marker options and faultfs_explore."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from faultfs import FaultFS, HealthCheck
from tests.support.pytest_run import run_pytest


def test_fixture_is_active_under_an_empty_real_directory(faultfs: FaultFS, tmp_path: Path) -> None:
    assert faultfs.active and faultfs.profile == "posix" and faultfs.outside == "refuse"
    assert faultfs.root == str(tmp_path / "faultfs")
    with open(faultfs.path("f"), "w") as handle:
        handle.write("x")
    assert faultfs.tree() == {"f": b"x"}
    faultfs.__exit__()  # look at the real disk: the directory is there, and empty
    try:
        assert list((tmp_path / "faultfs").iterdir()) == []
    finally:
        faultfs.__enter__()


ESCAPES = """
import io, mmap, os, sqlite3, subprocess, sys

def make_saver(_open=os.open):  # bound before activation, where no scan reaches
    def save(path):
        os.close(_open(path, os.O_CREAT | os.O_WRONLY))
    return save

save = make_saver()

def test_swallowed_escape(faultfs):
    try:
        save(faultfs.path("b"))
    except Exception:
        pass

from io import FileIO  # bound at import: faultfs intercepts io.FileIO looked up at the call

def test_swallowed_fileio(faultfs):
    try:
        FileIO(faultfs.path("raw"), "w")
    except Exception:
        pass

def test_sqlite_in_the_fixture(faultfs):
    sqlite3.connect(faultfs.path("x.db")).execute("create table t(x)").connection.commit()

def test_sqlite_in_explore(faultfs_explore):
    def workload(fs):
        with open(fs.path("a"), "w") as handle:
            handle.write("x")
        try:  # swallowed, as a library that falls back to another store would
            sqlite3.connect(fs.path("x.db")).execute("create table t(x)").connection.commit()
        except Exception:
            pass

    faultfs_explore(workload, lambda img: None)

def test_mmap_in_the_fixture(faultfs):
    with open(faultfs.path("m"), "wb") as handle:
        handle.write(bytes(4096))
    with open(faultfs.path("m"), "r+b") as handle:
        mmap.mmap(handle.fileno(), 4096)

def test_subprocess_in_the_fixture(faultfs):  # told the path on stdin: faultfs cannot tell
    code = "import sys; open(sys.stdin.read(), 'w').write('x')"
    subprocess.run([sys.executable, "-c", code], input=faultfs.path("x.txt"), text=True)

def test_subprocess_told_the_root(faultfs):
    code = f"open({faultfs.path('y.txt')!r}, 'w').write('x')"
    subprocess.run([sys.executable, "-c", code], check=True)
"""


def test_swallowed_escapes_and_c_extension_writes_fail_the_test(tmp_path: Path) -> None:
    # Under the fixtures' root an escaped call is stopped and recorded even when the code
    # swallows the error, and a file written around Python's os and io (sqlite3's C code)
    # is reported instead of passing silently or failing with sqlite's own confusion.
    (tmp_path / "test_escapes.py").write_text(ESCAPES)
    result = run_pytest(tmp_path, "-rA")
    out = result.stdout + result.stderr
    lines = {line.split(" - ")[0] for line in out.splitlines() if " test_escapes.py::" in line}
    assert {
        "FAILED test_escapes.py::test_swallowed_escape",
        "FAILED test_escapes.py::test_swallowed_fileio",
        "FAILED test_escapes.py::test_sqlite_in_the_fixture",
        "FAILED test_escapes.py::test_sqlite_in_explore",
        "FAILED test_escapes.py::test_mmap_in_the_fixture",
        "FAILED test_escapes.py::test_subprocess_in_the_fixture",  # found right after the call
        "FAILED test_escapes.py::test_subprocess_told_the_root",
    } <= lines, out
    assert "calls os.open through `_open`, bound before the FaultFS was activated" in out
    assert "`from io import FileIO`, for instance" in out
    # sqlite3 and mmap are named when they start, with what faultfs cannot see (even
    # when the code swallows the error); what a child process writes is found afterwards.
    assert out.count("sqlite3 reads and writes it from C") >= 2, out
    assert "mmap.mmap of " in out and "loads and stores in a mapping" in out, out
    assert "x.txt appeared on the real disk under the FaultFS root" in out, out
    assert "its arguments name" in out and "y.txt appeared" not in out, out


@pytest.mark.faultfs(
    profile="lazyfs",
    block_size=512,
    root="/faultfs-plugin-root",
    outside="passthrough",
    suppress_health_check=[HealthCheck.no_boundaries],
)
def test_marker_options(faultfs: FaultFS) -> None:
    assert (faultfs.profile, faultfs.block_size, faultfs.root, faultfs.outside) == (
        "lazyfs",
        512,
        "/faultfs-plugin-root",
        "passthrough",
    )


@pytest.mark.faultfs(suppress_health_check=["outside_root"])
def test_paths_outside_the_root_are_refused_by_default(faultfs: FaultFS, tmp_path: Path) -> None:
    with pytest.raises(PermissionError, match="outside the faultfs root"):
        os.listdir(tmp_path / "elsewhere")  # tmp_path itself holds the root: it may be read
    assert faultfs.outside_calls == 1
    with open(faultfs.path("f"), "w") as handle:
        handle.write("x")


def unsynced_write(fs: FaultFS) -> None:
    with open(fs.path("f"), "w") as handle:
        handle.write("x")
    fs.ack("f")


def synced_write(fs: FaultFS) -> None:
    fd = os.open(fs.path("f"), os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"x")
    os.fsync(fd)
    os.close(fd)
    dfd = os.open(fs.root, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    fs.ack("f")


def check(img: FaultFS) -> None:
    if img.acked:
        with open(img.path("f")) as handle:
            assert handle.read() == "x"


def test_explore_helper(faultfs_explore: Any) -> None:
    assert faultfs_explore(synced_write, check).ok
    report = faultfs_explore(unsynced_write, check, expect_failures=True)
    assert "power" in report.modes_failed()
    with pytest.raises(pytest.fail.Exception, match="from 2 causes"):
        faultfs_explore(unsynced_write, check)
