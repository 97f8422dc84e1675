"""The classic durability bugs as small workloads (shared by the explore and cause tests).

Each workload is small, hand-written code of the kind real programs contain;
its flags plant exactly one classic mistake. ``CLASSIC`` lists the six bugs of
docs/faultfs.md with the profiles in which a real file system exposes them.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from faultfs import PROFILES, FaultFS

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
        view = view[os.write(fd, view) :]  # step: write-all


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
    os.replace(tmp, path)  # step: replace
    if dir_sync:
        fsync_dir(os.path.dirname(path))


def config_workload(*, file_sync: bool = True, dir_sync: bool = True) -> Callable[[FaultFS], None]:
    def workload(fs: FaultFS) -> None:
        for version in (1, 2):
            body = json.dumps({"version": version, "pad": "x" * 40}).encode()
            atomic_write(fs.path("config.json"), body, file_sync=file_sync, dir_sync=dir_sync)
            fs.ack(version)  # step: ack-version

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
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # step: create-record
            write_all(fd, f"record {i}\n".encode())
            os.fsync(fd)
            os.close(fd)
            if dir_sync:
                fsync_dir(fs.path("records"))
            fs.ack(i)  # step: ack-record

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
                os.write(fd, json.dumps({"n": i}).encode() + b"\n")  # step: log-write
                if ack_first:
                    fs.ack(i)  # step: ack-first
                if eio_retry is not None and i == 1:
                    fs.fail_next_fsync(errno=errno.EIO)
                try:
                    os.fsync(fd)  # step: fsync
                except OSError:
                    if not eio_retry:
                        return  # correct: the record is lost, never acknowledge it
                    os.fsync(fd)  # step: retry (the bug: it "succeeds" on clean pages)
                if not ack_first:
                    fs.ack(i)  # step: ack-after-fsync
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
        assert 99 in numbers, "recovery's record is unreadable"  # step: recovery-check
        for i in img.acked:
            assert i in numbers, f"acknowledged record {i} missing"

    return check


# --------------------------------------------------------- the six bugs


class Classic(NamedTuple):
    """One classic bug: its workload, the check, and what explore must say about it."""

    name: str
    workload: Any
    check: Any
    setup: Any
    visible_in: tuple[str, ...]  # profiles in which a real file system exposes it
    cause: str  # the cause kind explore must report
    # (role, the "# step:" marker on the line where that step happens)
    steps: tuple[tuple[str, str], ...]
    fix: str  # a phrase of the fix hint


CLASSIC = [
    Classic(
        "atomic write, no fsync of the temp file before the rename",
        config_workload(file_sync=False),
        config_check,
        config_setup,
        ("posix", "lazyfs"),
        "unsynced-before-rename",
        (("write", "write-all"), ("rename", "replace")),
        "fsync the file before the rename",
    ),
    Classic(
        "atomic write, no directory fsync after the rename",
        config_workload(dir_sync=False),
        config_check,
        config_setup,
        ("posix", "ext4-ordered"),
        "entry-not-durable",
        (("rename", "replace"), ("acknowledged", "ack-version")),
        "fsync the directory (.) after the rename",
    ),
    Classic(
        "new file fsynced, its directory never fsynced",
        records_workload(dir_sync=False),
        records_check,
        records_setup,
        ("posix",),
        "entry-not-durable",
        (("create", "create-record"), ("acknowledged", "ack-record")),
        "fsync their directory (records) after creating them",
    ),
    Classic(
        "append log acknowledges before fsync",
        log_workload(ack_first=True),
        log_check,
        log_setup,
        ("posix", "ext4-ordered", "lazyfs"),
        "unsynced-before-ack",
        (("write", "log-write"), ("acknowledged", "ack-first")),
        "fsync the file before acknowledging",
    ),
    Classic(
        "append log reopened without torn-tail repair",
        log_workload(),
        log_recover_and_check(repair=False),
        log_setup,
        ("posix", "ext4-ordered", "lazyfs"),
        "torn-write",
        (("write", "log-write"), ("recovery", "recovery-check")),
        "cut a torn tail",
    ),
    Classic(
        "fsync retried after EIO, then acknowledged",
        log_workload(eio_retry=True),
        log_check,
        log_setup,
        ("posix", "ext4-ordered", "lazyfs"),
        "fsync-error",
        (
            ("write", "log-write"),
            ("failed fsync", "fsync"),
            ("retried fsync", "retry"),
            ("acknowledged", "ack-after-fsync"),
        ),
        "a retried fsync returns success without writing",
    ),
]


def line_of(marker: str) -> int:
    """The line of this module that carries ``# step: <marker>``."""
    lines = Path(__file__).read_text().splitlines()
    found = [
        number
        for number, line in enumerate(lines, 1)
        if re.search(rf"# step: {re.escape(marker)}( \(|$)", line)
    ]
    assert len(found) == 1, f"marker {marker!r} found on lines {found}"
    return found[0]


def machine_settings(max_examples: int, **extra: Any) -> Any:
    """Hypothesis settings for a CrashStateMachine run in a unit test: no explain phase
    (it replays each failing crash step many times), no database, no deadline."""
    from hypothesis import HealthCheck, Phase, settings

    return settings(
        phases=(Phase.generate, Phase.shrink),
        max_examples=max_examples,
        stateful_step_count=5,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
        **extra,
    )
