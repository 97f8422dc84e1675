"""Kernel interfaces (/proc, /sys, /dev's devices) are not storage: outside="refuse" lets
them through uncounted (review s27d).

filelock 4 stats /proc/self/ns/pid on every lock, so a store that locks with it
failed the outside_root health check with the advice to build the path from the
root, which no user can follow; the only way out was outside="passthrough", which
also lets real files go unchecked. Files a program keeps in /dev/shm are storage it
chose, and a call that changes names stays refused everywhere outside the root.
"""

from __future__ import annotations

import json
import os

import pytest

from faultfs import FaultFS, explore
from faultfs.errors import OutsideRootError


def test_reads_of_proc_and_sys_and_device_io_pass_uncounted(tmp_path) -> None:
    fs = FaultFS(str(tmp_path / "root"), outside="refuse")
    with fs:
        os.stat("/proc/self/ns/pid")
        with open("/proc/self/status") as handle:
            assert "Pid:" in handle.read()
        assert os.path.exists("/sys/kernel")
        with open(os.devnull, "w") as sink:
            sink.write("dropped")
        with open("/dev/urandom", "rb") as source:
            assert len(source.read(4)) == 4
    assert fs.outside_calls == 0, fs.outside_examples


@pytest.mark.parametrize(
    "call",
    [
        lambda: open("/dev/shm/faultfs-s27d-never", "w"),
        lambda: os.mkdir("/proc/faultfs-s27d-never"),
        lambda: os.rename("/dev/null", "/dev/faultfs-s27d-never"),
        lambda: open("/tmp/faultfs-s27d-never", "w"),
    ],
    ids=["dev-shm", "mkdir-proc", "rename-dev", "tmp"],
)
def test_storage_and_name_changes_outside_stay_refused(tmp_path, call) -> None:
    with FaultFS(str(tmp_path / "root"), outside="refuse"), pytest.raises(OutsideRootError):
        call()


def test_explore_of_a_store_that_stats_proc_per_lock_passes_its_health_checks() -> None:
    def save(fs: FaultFS, version: int) -> None:
        os.stat("/proc/self/ns/pid")  # what filelock does before taking the lock
        with open(fs.path("v.tmp"), "w") as handle:
            json.dump(version, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(fs.path("v.tmp"), fs.path("v.json"))
        fd = os.open(fs.root, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    def workload(fs: FaultFS) -> None:
        for version in (1, 2):
            save(fs, version)
            fs.ack(version)

    def check(img: FaultFS) -> None:
        with open(img.path("v.json")) as handle:
            assert json.load(handle) >= max(img.acked, default=0)

    report = explore(workload, check, setup=lambda fs: save(fs, 0))
    assert report.ok, report
