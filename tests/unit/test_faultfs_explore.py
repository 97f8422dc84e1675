"""explore() finds the classic durability bugs and passes their corrected versions.

Each workload below is small, hand-written code of the kind real programs
contain; the buggy flag plants exactly one classic mistake.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from typing import Any

import pytest

from faultfs import MODES, PROFILES, ExploreReport, FaultFS, explore
from faultfs.errors import ExploreFailed

ALL_PROFILES = sorted(PROFILES)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY


def fsync_dir(path: str) -> None:
    fd = os.open(path, DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# ------------------------------------------------------------ atomic write


def atomic_write(path: str, data: bytes, *, file_sync: bool, dir_sync: bool) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        if file_sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if dir_sync:
        fsync_dir(os.path.dirname(path))


def config_workload(*, file_sync: bool = True, dir_sync: bool = True) -> Callable[[FaultFS], None]:
    def workload(fs: FaultFS) -> None:
        for version in (1, 2):
            body = json.dumps({"version": version, "pad": "x" * 40}).encode()
            atomic_write(fs.path("config.json"), body, file_sync=file_sync, dir_sync=dir_sync)
            fs.ack(version)

    return workload


def config_setup(fs: FaultFS) -> None:
    with open(fs.path("config.json"), "w") as handle:
        json.dump({"version": 0}, handle)


def config_check(img: FaultFS) -> None:
    with open(img.path("config.json")) as handle:
        version = json.load(handle)["version"]
    newest_acked = max(img.acked, default=0)
    assert version >= newest_acked, f"acknowledged version {newest_acked} lost, found {version}"


# ---------------------------------------------------------- created files


def records_workload(*, dir_sync: bool = True) -> Callable[[FaultFS], None]:
    def workload(fs: FaultFS) -> None:
        for i in range(2):
            path = fs.path("records", f"r{i}")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            write_all(fd, f"record {i}\n".encode())
            os.fsync(fd)
            os.close(fd)
            if dir_sync:
                fsync_dir(fs.path("records"))
            fs.ack(i)

    return workload


def records_setup(fs: FaultFS) -> None:
    os.mkdir(fs.path("records"))


def records_check(img: FaultFS) -> None:
    for i in img.acked:
        with open(img.path("records", f"r{i}"), "rb") as handle:
            assert handle.read() == f"record {i}\n".encode()


# ------------------------------------------------------------- append log


def open_log(fs: FaultFS) -> int:
    return os.open(fs.path("log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def log_setup(fs: FaultFS) -> None:
    os.close(open_log(fs))


def log_workload(*, ack_first: bool = False, eio_retry: bool | None = None) -> Any:
    """Append three records; ``eio_retry`` injects an EIO on the second fsync."""

    def workload(fs: FaultFS) -> None:
        fd = open_log(fs)
        try:
            for i in range(3):
                os.write(fd, json.dumps({"n": i}).encode() + b"\n")
                if ack_first:
                    fs.ack(i)
                if eio_retry is not None and i == 1:
                    fs.fail_next_fsync(errno=errno.EIO)
                try:
                    os.fsync(fd)
                except OSError:
                    if not eio_retry:
                        return  # correct: the record is lost, never acknowledge it
                    os.fsync(fd)  # the bug: the retry "succeeds" on clean pages
                if not ack_first:
                    fs.ack(i)
        finally:
            os.close(fd)

    return workload


def read_records(path: str) -> list[dict[str, int]]:
    """A reader that skips damaged lines instead of failing on them."""
    with open(path, "rb") as handle:
        records = []
        for line in handle.read().split(b"\n"):
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records


def log_check(img: FaultFS) -> None:
    numbers = [r["n"] for r in read_records(img.path("log"))]
    for i in img.acked:
        assert i in numbers, f"acknowledged record {i} missing from {numbers}"


def log_recover_and_check(*, repair: bool) -> Callable[[FaultFS], None]:
    """Recovery appends a new record; without repair it glues onto a torn tail."""

    def check(img: FaultFS) -> None:
        path = img.path("log")
        if repair:
            with open(path, "rb") as handle:
                data = handle.read()
            keep = data.rfind(b"\n") + 1
            if keep != len(data):
                os.truncate(path, keep)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.write(fd, json.dumps({"n": 99}).encode() + b"\n")
        os.fsync(fd)
        os.close(fd)
        numbers = [r["n"] for r in read_records(path)]
        assert 99 in numbers, "the record appended by recovery is unreadable"
        for i in img.acked:
            assert i in numbers, f"acknowledged record {i} missing"

    return check


# ------------------------------------------------------------------ tests


def run(workload: Any, check: Any, setup: Any, profile: str, modes: Any = MODES) -> ExploreReport:
    return explore(workload, check, setup=setup, profile=profile, modes=modes)


def test_no_fsync_before_rename_is_caught_where_the_file_system_allows_it() -> None:
    workload = config_workload(file_sync=False)
    for profile in ("posix", "lazyfs"):
        report = run(workload, config_check, config_setup, profile)
        assert not report.ok
        assert {"power", "reorder"} <= report.modes_failed()
        assert "process" not in report.modes_failed()
    # ext4's auto_da_alloc flushes a file's data when it replaces another one.
    assert run(workload, config_check, config_setup, "ext4-ordered").ok


def test_no_directory_fsync_after_rename_is_caught_in_posix_not_lazyfs() -> None:
    workload = config_workload(dir_sync=False)
    report = run(workload, config_check, config_setup, "posix")
    assert "power" in report.modes_failed()
    assert "process" not in report.modes_failed()
    assert run(workload, config_check, config_setup, "lazyfs").ok


def test_created_file_without_directory_fsync_is_caught_in_posix() -> None:
    workload = records_workload(dir_sync=False)
    report = run(workload, records_check, records_setup, "posix")
    assert "power" in report.modes_failed()
    # ext4 commits the creating transaction with the file's fsync; lazyfs
    # makes namespace changes durable at once.
    assert run(workload, records_check, records_setup, "ext4-ordered").ok
    assert run(workload, records_check, records_setup, "lazyfs").ok


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_acknowledging_before_fsync_is_caught(profile: str) -> None:
    report = run(log_workload(ack_first=True), log_check, log_setup, profile)
    assert "power" in report.modes_failed()
    assert "process" not in report.modes_failed()
    failure = next(f for f in report.failures if f.mode == "power")
    assert failure.phase == "before" and failure.op.kind == "fsync"


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_missing_torn_tail_repair_is_caught_only_by_torn(profile: str) -> None:
    report = run(log_workload(), log_recover_and_check(repair=False), log_setup, profile)
    assert report.modes_failed() == {"torn"}


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_retrying_fsync_after_eio_then_acknowledging_is_caught(profile: str) -> None:
    report = run(log_workload(eio_retry=True), log_check, log_setup, profile)
    assert "power" in report.modes_failed()
    # The page cache still holds the record: a process kill keeps it.
    assert "process" not in report.modes_failed()


CORRECT = [
    ("atomic write", config_workload(), config_check, config_setup),
    ("created files", records_workload(), records_check, records_setup),
    ("append log", log_workload(), log_recover_and_check(repair=True), log_setup),
    ("eio gives up", log_workload(eio_retry=False), log_check, log_setup),
]


@pytest.mark.parametrize("profile", ALL_PROFILES)
@pytest.mark.parametrize(
    ("name", "workload", "check", "setup"), CORRECT, ids=[c[0] for c in CORRECT]
)
def test_corrected_versions_pass_every_mode(
    profile: str, name: str, workload: Any, check: Any, setup: Any
) -> None:
    report = run(workload, check, setup, profile)
    assert report.ok, str(report)
    assert report.boundaries > 0 and report.images_checked > 0


def test_report_groups_by_call_site_with_trace_and_key() -> None:
    report = run(config_workload(file_sync=False), config_check, config_setup, "posix")
    groups = report.groups()
    assert groups
    for site, failures in groups.items():
        assert site.startswith(__file__.rsplit(".", 1)[0]) or site.startswith("<after")
        for failure in failures:
            assert failure.site == site
            assert "mode=" in failure.key and "boundary=" in failure.key
    text = str(report)
    assert "operations before the crash" in text and "rename" in text
    with pytest.raises(ExploreFailed):
        report.assert_ok()


def test_replay_rebuilds_the_failing_image() -> None:
    workload = config_workload(file_sync=False)
    report = run(workload, config_check, config_setup, "posix")
    failure = report.failures[0]
    image = report.replay(failure, workload)
    assert image.origin is not None and image.origin.mode == failure.mode
    with image, pytest.raises(Exception):  # noqa: B017 - the same check fails again
        config_check(image)
