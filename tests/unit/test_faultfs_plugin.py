"""The pytest plugin: the faultfs fixture, its marker options and faultfs_explore."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from faultfs import FaultFS, HealthCheck


def test_fixture_is_active_under_a_virtual_root(faultfs: FaultFS, tmp_path: Path) -> None:
    assert faultfs.active and faultfs.profile == "posix" and faultfs.outside == "refuse"
    assert faultfs.root == str(tmp_path / "faultfs")
    with open(faultfs.path("f"), "w") as handle:
        handle.write("x")
    assert faultfs.tree() == {"f": b"x"}
    faultfs.__exit__()  # look at the real disk: nothing is there
    try:
        assert not (tmp_path / "faultfs").exists()
    finally:
        faultfs.__enter__()


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
