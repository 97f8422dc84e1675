"""Health checks: explore and the fixtures fail a run that would pass without testing anything."""

from __future__ import annotations

import itertools
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from faultfs import FailedHealthCheck, FaultFS, HealthCheck, explore
from faultfs.errors import ConfigError, NondeterministicWorkload
from tests.support.faultfs_classic import fsync_dir, write_all

pytest_plugins = ["pytester"]


def durable_write(fs: FaultFS) -> None:
    fd = os.open(fs.path("f"), os.O_WRONLY | os.O_CREAT, 0o644)
    write_all(fd, b"x")
    os.fsync(fd)
    os.close(fd)
    fsync_dir(fs.root)
    fs.ack("f")


def check(img: FaultFS) -> None:
    if img.acked:
        assert img.read_file("f") == b"x"


def test_a_healthy_run_passes() -> None:
    report = explore(durable_write, check)
    assert report.ok and report.boundaries == 8


# ------------------------------------------------------------- no_boundaries


def writes_elsewhere(fs: FaultFS) -> None:
    os.listdir(fs.root)  # reads the root, writes nothing there
    fs.ack("nothing")


def failed_check(workload: Any, checker: Any, expected: HealthCheck) -> str:
    """The message of the health check ``expected``, which explore must fail."""
    with pytest.raises(FailedHealthCheck) as info:
        explore(workload, checker)
    assert info.value.health_check is expected
    return str(info.value)


def test_no_boundaries(tmp_path: Path) -> None:
    message = failed_check(writes_elsewhere, check, HealthCheck.no_boundaries)
    assert "passed no boundary under the root '/faultfs-explore'" in message
    assert "fs.path('name')" in message
    assert "suppress_health_check=[faultfs.HealthCheck.no_boundaries]" in message


# -------------------------------------------------------------- outside_root


def test_outside_root_when_passed_through(tmp_path: Path) -> None:
    log = tmp_path / "real.log"

    def workload(fs: FaultFS) -> None:
        durable_write(fs)
        with open(log, "a") as f:
            f.write("wrote f\n")

    with pytest.raises(FailedHealthCheck) as info:
        explore(workload, check, outside="passthrough")
    assert info.value.health_check is HealthCheck.outside_root
    message = str(info.value)
    assert f"open({str(log)!r}) at {__file__}:" in message
    assert "reached the real file system" in message and "fs.path('name')" in message


def test_outside_root_when_the_refusal_was_swallowed(tmp_path: Path) -> None:
    def workload(fs: FaultFS) -> None:
        durable_write(fs)
        try:
            os.unlink(tmp_path / "stale.lock")
        except OSError:  # "it was not there": the refusal disappears here
            pass

    with pytest.raises(FailedHealthCheck, match="were refused") as info:
        explore(workload, check)
    assert info.value.health_check is HealthCheck.outside_root


def test_outside_root_in_the_check(tmp_path: Path) -> None:
    expected = tmp_path / "expected"
    expected.write_bytes(b"x")

    def reads_a_real_file(img: FaultFS) -> None:
        if img.acked:
            assert img.read_file("f") == expected.read_bytes()

    with pytest.raises(FailedHealthCheck, match="recover_and_check made 1 call") as info:
        explore(durable_write, reads_a_real_file, outside="passthrough")
    assert info.value.health_check is HealthCheck.outside_root


# ----------------------------------------------------------- check_never_ran


def test_check_never_ran() -> None:
    with pytest.raises(FailedHealthCheck) as info:
        explore(durable_write, lambda img: None)
    assert info.value.health_check is HealthCheck.check_never_ran
    message = str(info.value)
    assert "made no call under the root on any of the" in message
    assert "img.tree()" in message


def test_a_check_that_only_lists_the_root_counts_as_looking() -> None:
    assert explore(durable_write, lambda img: os.listdir(img.root)).ok


# ---------------------------------------------------------- nondeterministic


def flaky_workload() -> Any:
    runs = itertools.count()

    def workload(fs: FaultFS) -> None:
        durable_write(fs)
        if next(runs) % 2:  # module-level state that survives between runs
            with open(fs.path("extra"), "w") as f:
                f.write("y")

    return workload


def test_nondeterministic_runs_are_caught_before_the_sweep() -> None:
    with pytest.raises(FailedHealthCheck) as info:
        explore(flaky_workload(), check)
    assert info.value.health_check is HealthCheck.nondeterministic
    message = str(info.value)
    assert "passed 8 and 12 boundaries" in message
    assert "(nothing: the run had ended)" in message and "create " in message
    assert "reset module-level state" in message


def test_temporary_names_that_differ_between_runs_are_deterministic_enough() -> None:
    names = itertools.count()

    def workload(fs: FaultFS) -> None:
        tmp = fs.path(f"f.{next(names)}.tmp")  # a random temporary name, as mkstemp makes
        with open(tmp, "w") as f:
            f.write("x")
        os.replace(tmp, fs.path("f"))
        fs.ack("f")

    assert explore(workload, lambda img: img.tree()).boundaries == 6


# ------------------------------------------------------- nothing_acknowledged


def test_a_workload_that_acknowledges_nothing_fails_the_health_check() -> None:
    def forgets_ack(fs: FaultFS) -> None:  # saves without fsync; the check cannot tell
        with open(fs.path("f"), "w") as f:
            f.write("x")

    def reads(img: FaultFS) -> None:
        check(img)
        img.tree()

    message = failed_check(forgets_ack, reads, HealthCheck.nothing_acknowledged)
    assert "the workload acknowledged nothing" in message
    assert "Call fs.ack(x) in the workload" in message
    report = explore(forgets_ack, reads, suppress_health_check=["nothing_acknowledged"])
    assert report.ok  # what the check, blind without acks, passes


# ---------------------------------------------------------------- suppressing


@pytest.mark.parametrize(
    ("workload_check", "name"),
    [
        ((writes_elsewhere, lambda img: img.tree()), HealthCheck.no_boundaries),
        ((durable_write, lambda img: None), HealthCheck.check_never_ran),
    ],
    ids=["no_boundaries", "check_never_ran"],
)
def test_a_suppressed_check_lets_the_run_pass(workload_check: Any, name: HealthCheck) -> None:
    workload, checker = workload_check
    with pytest.raises(FailedHealthCheck):
        explore(workload, checker)
    assert explore(workload, checker, suppress_health_check=[name]).ok
    assert explore(workload, checker, suppress_health_check=[name.name]).ok


def fading_workload() -> Any:
    runs = itertools.count()

    def workload(fs: FaultFS) -> None:
        if next(runs) < 2:  # the first two runs agree; later ones do nothing
            durable_write(fs)

    return workload


def test_a_rerun_that_never_reaches_its_boundary_is_caught() -> None:
    with pytest.raises(NondeterministicWorkload, match="never reached boundary 1") as info:
        explore(fading_workload(), check)
    assert info.value.health_check is HealthCheck.nondeterministic


def test_suppressing_nondeterminism_skips_unreached_boundaries() -> None:
    off = [HealthCheck.nondeterministic]
    assert explore(flaky_workload(), check, suppress_health_check=off).ok
    report = explore(fading_workload(), check, suppress_health_check=off)
    assert report.unreached == [2, 3, 4, 5, 6, 7, 8]


def test_suppressing_outside_root_with_passthrough(tmp_path: Path) -> None:
    def workload(fs: FaultFS) -> None:
        durable_write(fs)
        (tmp_path / "log").write_text("x")

    report = explore(
        workload, check, outside="passthrough", suppress_health_check=[HealthCheck.outside_root]
    )
    assert report.ok and (tmp_path / "log").read_text() == "x"


def test_unknown_names_are_refused() -> None:
    with pytest.raises(ConfigError, match="no_boundaries"):
        explore(durable_write, check, suppress_health_check=["too_slow"])


# ---------------------------------------------------------------- the fixtures

FIXTURE_TESTS = """
import os

import pytest

from faultfs import HealthCheck


def test_writes_nothing(faultfs):
    assert os.listdir(faultfs.root) == []


@pytest.mark.faultfs(suppress_health_check=[HealthCheck.no_boundaries])
def test_writes_nothing_on_purpose(faultfs):
    assert os.listdir(faultfs.root) == []


def test_writes_a_real_file(faultfs, tmp_path):
    with open(faultfs.path("f"), "w") as f:
        f.write("x")
    try:
        (tmp_path / "real").write_text("x")
    except PermissionError:
        pass


def test_writes_inside(faultfs):
    with open(faultfs.path("f"), "w") as f:
        f.write("x")


def test_a_relative_path(faultfs):
    with open("notes.txt", "w") as f:  # meant faultfs.path("notes.txt")
        f.write("x")


def test_explore_with_a_check_that_looks_at_nothing(faultfs_explore):
    def workload(fs):
        with open(fs.path("f"), "w") as f:
            f.write("x")
        fs.ack("f")

    faultfs_explore(workload, lambda img: None)
"""


def test_the_fixtures_run_the_health_checks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_scratch=textwrap.dedent(FIXTURE_TESTS))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2, failed=4)
    out = result.stdout.str()
    assert "FAILED test_scratch.py::test_writes_nothing - Failed: FailedHealthCheck" in out
    assert "health check no_boundaries failed: the test passed no boundary" in out
    assert "health check outside_root failed: the test made 1 call" in out
    assert "health check check_never_ran failed" in out
    # A refused call fails at the user's line, without faultfs's own frames.
    assert "E       faultfs.errors.OutsideRootError: open(relative path 'notes.txt'" in out
    assert "_intercept.py" not in out
