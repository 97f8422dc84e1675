"""``--fuzz-budget`` (oracle/fuzz_budget.py): the nightly fuzzers stop in time, and say so.

Real pytest runs on a throw-away project (ci/nightly.sh, or pytest itself) whose fake
fuzzers would run for hours: each must pass within its budget, say after how many
examples it stopped, and never hide a bug it found. The times are budgets the runs
must stop at, not durations they are measured against, so the load does not matter.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from oracle import fuzz_budget
from tests.support.ci_project import fake_project, run_in, run_script

pytestmark = pytest.mark.waits

ENDLESS_FUZZERS = """
import time

import pytest
from hypothesis import given, settings, strategies as st

pytestmark = pytest.mark.stress


@pytest.mark.parametrize("i", range(2))
@settings(max_examples=1_000_000)
@given(st.integers())
def test_endless(i, n):
    time.sleep(0.1)  # long enough that the engine's work between examples is not the cost


def test_plain():
    pass
"""

CAPPED_FUZZER = """
import time

import pytest
from hypothesis import given, settings, strategies as st

pytestmark = pytest.mark.stress


# The call only: setup's imports vary with the load. It stops at 16 s: 4 s for the example in
# flight (the engine once paused 1.9 s between examples at a load of 22).
# An example sleeps 100 ms: at 10 ms the engine's work between the examples (505 of them at a
# load of 18) cost about 0.4 of the child's 1.4 CPU s; the test is about when it stops.
@pytest.mark.timeout(20, func_only=True)
@settings(max_examples=1_000_000)
@given(st.integers())
def test_capped(n):
    time.sleep(0.1)
"""

SLOW_BUG = """
import time

import pytest
from hypothesis import given, strategies as st

pytestmark = pytest.mark.stress

SLEPT = []


@given(st.integers(min_value=10))
def test_slow_bug(n):
    if not SLEPT:  # the budget runs out while the first example runs; shrinking is quick
        SLEPT.append(n)
        time.sleep(0.3)
    assert n < 10
"""

STOPPED = re.compile(r"(\S+): stopped at budget after (\d+) of (\d+) examples \((.*)\)")


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_in(
        root, [sys.executable, "-m", "pytest", "--run-stress", "-p", "no:randomly", *args]
    )


def test_nightly_fuzzers_stop_at_the_shards_budget_and_pass_saying_so(tmp_path: Path) -> None:
    # Two fuzzers of 10^6 examples of 100 ms each (days) on two xdist workers, 3 s of budget.
    root = fake_project(tmp_path / "project", ENDLESS_FUZZERS)
    summary = tmp_path / "step-summary.md"
    result = run_script(
        root,
        "nightly.sh",
        NIGHTLY_BUDGET_S="3",
        NIGHTLY_WORKERS="2",
        GITHUB_STEP_SUMMARY=str(summary),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fuzz budget=3s" in result.stdout
    stopped = {m[0]: m for m in STOPPED.findall(result.stdout)}
    assert set(stopped) == {f"tests/stress/test_fake.py::test_endless[{i}]" for i in (0, 1)}
    for _, ran, asked, why in stopped.values():
        assert 1 <= int(ran) < int(asked) == 1_000_000
        assert why == "the session's --fuzz-budget of 3 s"
    assert "3 passed" in result.stdout
    kept = (root / "nightly-logs" / "budget-shard-0.txt").read_text()
    assert len(STOPPED.findall(kept)) == 2 and "2 stress test(s) stopped at budget" in kept
    assert "Fuzz budget: shard 0 of 1" in summary.read_text()
    assert len(STOPPED.findall(summary.read_text())) == 2


def test_a_fuzzer_stops_before_its_per_test_cap_instead_of_failing_at_it(tmp_path: Path) -> None:
    # Without the budget this is a StressTestTimeout at 20 s (test_workflows has such a case).
    root = fake_project(tmp_path / "project", CAPPED_FUZZER)
    result = _pytest(root, "--fuzz-budget", "100000", "tests/stress")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "StressTestTimeout" not in result.stdout
    [(_, ran, _, why)] = STOPPED.findall(result.stdout)
    assert int(ran) >= 1
    assert why == f"{fuzz_budget.CAP_SHARE:.0%} of its per-test cap of 20 s"


def test_a_bug_found_is_shrunk_reported_and_saved_not_stopped(tmp_path: Path) -> None:
    root = fake_project(tmp_path / "project", SLOW_BUG)
    result = _pytest(root, "--fuzz-budget", "0.1", "tests/stress")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed" in result.stdout
    assert "n=10" in result.stdout  # the falsifying example, as without a budget
    assert not STOPPED.findall(result.stdout)
    assert list((root / ".hypothesis").glob("examples/*/*")), "the failure was not saved"


def test_a_budget_that_is_not_a_positive_number_is_refused(tmp_path: Path) -> None:
    root = fake_project(tmp_path / "project", CAPPED_FUZZER)
    for bad in ("0", "-5", "nan"):
        result = _pytest(root, "--fuzz-budget", bad, "tests/stress")
        assert result.returncode == 4, result.stdout + result.stderr
        assert "--fuzz-budget must be a positive number of seconds" in result.stderr
    result = run_script(root, "nightly.sh", NIGHTLY_BUDGET_S="soon")
    assert result.returncode == 2
    assert "NIGHTLY_BUDGET_S must be a number of seconds (0: no budget)" in result.stderr


def test_without_a_budget_hypothesis_is_left_as_it_is() -> None:
    # This run has no --fuzz-budget: so the ci and default profiles run every example.
    from hypothesis.internal.conjecture.engine import ConjectureRunner

    assert fuzz_budget.check_supported() is None
    assert not hasattr(ConjectureRunner.should_generate_more, "__wrapped__")
