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
import os

import pytest

from faultfs import FailedHealthCheck, FaultFS, HealthCheck, explore


def _save(path: str, data: dict[str, int]) -> None:
    """A durable save: fsync the file before the rename, then the directory."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def _workload(fs: FaultFS) -> None:
    for version in (1, 2):
        _save(fs.path("state.json"), {"v": version})
        fs.ack(version)


def _setup(fs: FaultFS) -> None:
    _save(fs.path("state.json"), {"v": 0})


def _typo_check(img: FaultFS) -> None:
    with open(img.path("state.json")) as f:
        assert json.laod(f)["v"] >= max(img.acked, default=0)  # type: ignore[attr-defined]


def test_a_check_that_fails_before_any_crash_stops_explore_naming_its_error() -> None:
    with pytest.raises(FailedHealthCheck) as info:
        explore(_workload, _typo_check, setup=_setup)
    assert info.value.health_check is HealthCheck.check_fails_at_start
    message = str(info.value)
    assert "fails on the starting state" in message
    assert "AttributeError: module 'json' has no attribute 'laod'" in message
    assert "test_faultfs_check_at_start.py:" in message  # the check's line
    assert "fsync" not in message  # nothing blamed on the durable save


def test_a_check_that_needs_a_file_nobody_made_is_named_too() -> None:
    def check(img: FaultFS) -> None:  # no setup: the root starts empty
        with open(img.path("state.json")) as f:
            assert json.load(f)["v"] >= max(img.acked, default=0)

    with pytest.raises(FailedHealthCheck, match="FileNotFoundError"):
        explore(_workload, check)


def test_suppressed_the_sweep_runs_as_before() -> None:
    report = explore(
        _workload,
        _typo_check,
        setup=_setup,
        suppress_health_check=[HealthCheck.check_fails_at_start],
    )
    assert not report.ok


def test_a_check_that_accepts_the_start_runs_the_sweep() -> None:
    def check(img: FaultFS) -> None:
        with open(img.path("state.json")) as f:
            assert json.load(f)["v"] >= max(img.acked, default=0)

    assert explore(_workload, check, setup=_setup).ok
