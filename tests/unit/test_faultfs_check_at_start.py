"""explore stops when the check itself fails on the starting state.

A check with a typo (``json.laod``) fails on every image. Left to the sweep, cause
analysis then blamed the code under test: on atomicwrites, which fsyncs the file
and the directory, an outsider's report read "data never fsynced ... fix: fsync
tmp... after writing" (s24d). The starting state (setup's files, all durable,
nothing acknowledged) is one no crash can explain, so a check that rejects it
stops explore with the check's error and line, before any cause is named.
"""

from __future__ import annotations

import json

import pytest

from faultfs import FailedHealthCheck, FaultFS, HealthCheck, explore
from tests.support.faultfs_classic import config_check, config_setup, config_workload

DURABLE = config_workload(file_sync=True, dir_sync=True)


def _typo_check(img: FaultFS) -> None:
    with open(img.path("config.json")) as f:
        assert json.laod(f)["version"] >= max(img.acked, default=0)  # type: ignore[attr-defined]


def test_a_check_that_fails_before_any_crash_stops_explore_naming_its_error() -> None:
    with pytest.raises(FailedHealthCheck) as info:
        explore(DURABLE, _typo_check, setup=config_setup)
    assert info.value.health_check is HealthCheck.check_fails_at_start
    message = str(info.value)
    assert "fails on the starting state" in message
    assert "AttributeError: module 'json' has no attribute 'laod'" in message
    assert "test_faultfs_check_at_start.py:" in message  # the check's line
    assert "fsync" not in message  # nothing blamed on the durable save


def test_a_check_that_needs_a_file_nobody_made_is_named_too() -> None:
    with pytest.raises(FailedHealthCheck, match="FileNotFoundError"):
        explore(DURABLE, config_check)  # no setup: the root starts empty


def test_suppressed_the_sweep_runs_as_before() -> None:
    off = [HealthCheck.check_fails_at_start]
    report = explore(DURABLE, _typo_check, setup=config_setup, suppress_health_check=off)
    assert not report.ok


def test_a_check_that_accepts_the_start_runs_the_sweep() -> None:
    assert explore(DURABLE, config_check, setup=config_setup).ok
