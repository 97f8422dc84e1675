"""explore() finds the classic durability bugs and passes their corrected versions.

The workloads live in tests/support/faultfs_classic.py: small, hand-written
code of the kind real programs contain, each flag planting one classic mistake.
"""

from __future__ import annotations

from typing import Any

import pytest

from faultfs import MODES, ExploreReport, explore
from faultfs.errors import ExploreFailed
from tests.support.faultfs_classic import (
    ALL_PROFILES,
    config_check,
    config_setup,
    config_workload,
    log_check,
    log_recover_and_check,
    log_setup,
    log_workload,
    records_check,
    records_setup,
    records_workload,
)

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


def test_report_keeps_symptoms_by_crash_site_with_trace_and_key() -> None:
    report = run(config_workload(file_sync=False), config_check, config_setup, "posix")
    groups = report.groups()
    assert groups
    for site, failures in groups.items():
        assert "faultfs_classic.py:" in site or site.startswith("<after")
        for failure in failures:
            assert failure.site == site
            assert "mode=" in failure.key and "boundary=" in failure.key
            assert failure.trace and failure.trace[-1].seq > 0
    text = str(report)
    assert "from 1 cause" in text and "rename" in text and "fix: " in text
    with pytest.raises(ExploreFailed, match="was never fsynced before the rename"):
        report.assert_ok()


def test_replay_rebuilds_the_failing_image() -> None:
    workload = config_workload(file_sync=False)
    report = run(workload, config_check, config_setup, "posix")
    failure = report.failures[0]
    image = report.replay(failure, workload)
    assert image.origin is not None and image.origin.mode == failure.mode
    with image, pytest.raises(Exception):  # noqa: B017 - the same check fails again
        config_check(image)
