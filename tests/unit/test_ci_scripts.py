"""The ci/ scripts the workflows call, run on a throw-away project tree: nightly sharding
partitions the stress tests, a failure leaves a report with the reproduction, a shard cut
short still reports, and .ci/run shows both of its runs."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.ci_project import REPO, SCRIPT_TIMEOUT_S, fake_project, run_script
from tests.support.hypothesis_constants import share_constants
from tests.support.unused_plugins import PYTEST_INI
from tests.unit.test_workflows import CI_SCRIPT_REF, WORKFLOWS_DIR, _load, _runs

FAKE_STRESS_TESTS = """
import pytest
from hypothesis import given, strategies as st

pytestmark = pytest.mark.stress


@pytest.mark.parametrize("i", range(5))
def test_passes(i):
    pass


@given(st.integers(min_value=0, max_value=1000))
def test_finds_a_bug(n):
    assert n < 500
"""


def test_nightly_shards_partition_the_stress_tests_and_report_failures(tmp_path: Path) -> None:
    root = fake_project(tmp_path / "project", FAKE_STRESS_TESTS)
    results = {
        i: run_script(root, "nightly.sh", SHARD_INDEX=str(i), SHARD_COUNT="2") for i in (0, 1)
    }
    logs = root / "nightly-logs"
    picked = {i: (logs / f"shard-{i}.tests").read_text().split() for i in results}
    everything = (logs / "collected-0.txt").read_text()
    all_ids = [line for line in everything.split() if "::" in line]
    assert len(all_ids) == 6
    assert sorted(picked[0] + picked[1]) == sorted(all_ids)
    assert not set(picked[0]) & set(picked[1])

    failing = "tests/stress/test_fake.py::test_finds_a_bug"
    bad = next(i for i in picked if failing in picked[i])
    good = 1 - bad
    assert results[good].returncode == 0, results[good].stdout
    assert not (logs / f"report-shard-{good}.md").exists()
    assert results[bad].returncode == 1, results[bad].stdout
    report = (logs / f"report-shard-{bad}.md").read_text()
    assert f"shard {bad} of 2" in report
    assert f"python -m pytest --run-stress '{failing}'" in report
    # the example's header changed wording across Hypothesis versions
    assert "Falsifying example" in report or "Failing test case" in report
    assert "n=500" in report


def test_nightly_refuses_bad_shard_settings(tmp_path: Path) -> None:
    root = fake_project(tmp_path / "project", FAKE_STRESS_TESTS)
    for index, count in (("2", "2"), ("-1", "2"), ("0", "0"), ("x", "3")):
        result = run_script(root, "nightly.sh", SHARD_INDEX=index, SHARD_COUNT=count)
        assert result.returncode == 2
        assert "0 <= SHARD_INDEX < SHARD_COUNT" in result.stderr


def test_a_nightly_shard_with_nothing_to_run_succeeds(tmp_path: Path) -> None:
    root = fake_project(tmp_path / "project", FAKE_STRESS_TESTS)
    result = run_script(root, "nightly.sh", SHARD_INDEX="7", SHARD_COUNT="8")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "runs 0 of 6 stress tests" in result.stdout
    assert "nothing for this shard to run" in result.stdout


def test_stress_gate_uses_the_ci_profile_and_fails_when_it_ran_nothing(tmp_path: Path) -> None:
    empty = fake_project(tmp_path / "empty", None)
    env = {"HYPOTHESIS_PROFILE": ""}  # unset: the script must choose `ci` itself
    result = run_script(empty, "stress.sh", **env)
    assert result.returncode == 5
    assert "no stress tests were collected" in result.stderr
    assert "hypothesis profile=ci" in result.stdout


# -- .ci/run: the README's test command, then the stress suite under `ci` ------------

FAKE_UNIT_TESTS = """
import os


def test_one():
    pass


def test_two():
    assert os.environ.get("FAKE_BREAK_TESTS") != "1", "a broken unit test"
"""

FAKE_CI_STRESS_TESTS = """
import os

import pytest
from hypothesis import given, settings, strategies as st

pytestmark = pytest.mark.stress


def test_runs_under_the_derandomized_ci_profile():
    assert os.environ["HYPOTHESIS_PROFILE"] == "ci"
    assert settings.default.derandomize


@given(st.integers())
def test_drawn(n):
    assert os.environ.get("FAKE_BREAK_STRESS") != "1", "a broken stress test"
"""

# The real ci/tests.sh installs the project first; the fake project has nothing to install.
FAKE_TESTS_SH = """#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pytest tests/unit -p no:cacheprovider
"""


def _fake_ci_project(root: Path) -> Path:
    (root / ".ci").mkdir(parents=True)
    shutil.copy2(REPO / ".ci" / "run", root / ".ci" / "run")
    (root / "ci").mkdir()
    shutil.copy2(REPO / "ci" / "stress.sh", root / "ci" / "stress.sh")
    (root / "ci" / "tests.sh").write_text(FAKE_TESTS_SH)
    shutil.copy2(REPO / "conftest.py", root / "conftest.py")  # the stress gate and profiles
    (root / "pytest.ini").write_text(PYTEST_INI)
    for kind, text in (("unit", FAKE_UNIT_TESTS), ("stress", FAKE_CI_STRESS_TESTS)):
        (root / "tests" / kind).mkdir(parents=True)
        (root / "tests" / kind / f"test_{kind}.py").write_text(text)
    share_constants(root)
    return root


def _run_ci(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYPOTHESIS_"))}
    base["PATH"] = os.path.dirname(sys.executable) + os.pathsep + base.get("PATH", "")
    # A caller's profile must not leak into the stress run, which is always `ci`.
    base.update({"CI_INSTALL_REDIS": "0", "STRESS_WORKERS": "0", "HYPOTHESIS_PROFILE": "default"})
    base.update(env)
    return subprocess.run(
        ["bash", str(root / ".ci" / "run")],
        cwd=root,
        env=base,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )


def test_ci_run_calls_the_readme_test_command_then_the_stress_suite_under_ci() -> None:
    text = (REPO / ".ci" / "run").read_text().replace("\\\n", " ")
    commands = [line for line in text.splitlines() if not line.lstrip().startswith(("#", "echo"))]
    calls = [(m.group(1), line) for line in commands for m in re.finditer(r"\bbash (ci/\S+)", line)]
    assert [script for script, _ in calls] == ["ci/tests.sh", "ci/stress.sh"]
    assert re.search(r"\bHYPOTHESIS_PROFILE=ci\s", calls[1][1]), calls[1][1]
    # ci/tests.sh is the README's test command: install with the test stack, then `pytest`.
    readme = (REPO / "README.md").read_text()
    assert "pip install -e '.[dev]' && pytest" in readme
    tests_sh = [
        line.strip()
        for line in (REPO / "ci" / "tests.sh").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert "python -m pip install --quiet -e '.[dev]'" in tests_sh
    assert tests_sh[-1] == "pytest"
    # The PR gate runs the same two scripts in the same order.
    pr_runs = [r for r in _runs(_load(WORKFLOWS_DIR / "pr.yml")) if CI_SCRIPT_REF.findall(r)]
    assert [CI_SCRIPT_REF.findall(r)[0] for r in pr_runs] == ["ci/tests.sh", "ci/stress.sh"]


def test_ci_run_shows_both_runs_with_their_counts_and_passes(tmp_path: Path) -> None:
    result = _run_ci(_fake_ci_project(tmp_path / "project"))
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert out.index("ci: [1/2] tests") < out.index("ci: [2/2] stress")
    assert "stress: profile=ci" in out
    lines = out.splitlines()
    assert re.fullmatch(
        r"ci: tests \(pytest\): PASS: 2 passed(, \d+ warnings?)? in [0-9.]+s; \d+s", lines[-3]
    ), lines[-3]
    assert re.fullmatch(
        r"ci: stress \(ci profile\): PASS: 2 passed(, \d+ warnings?)? in [0-9.]+s; \d+s", lines[-2]
    ), lines[-2]
    assert re.fullmatch(r"ci: PASS: tests and stress \(ci profile\) both passed in \d+s", lines[-1])


def test_ci_run_runs_the_stress_suite_even_when_the_tests_fail_and_reports_both(
    tmp_path: Path,
) -> None:
    result = _run_ci(
        _fake_ci_project(tmp_path / "project"), FAKE_BREAK_TESTS="1", FAKE_BREAK_STRESS="1"
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    # pytest adds ", N warnings" to a summary when plugins warn (xdist disables
    # pytest-benchmark with one on some runners), so the counts are matched, not the tail.
    assert re.match(
        r"ci: tests \(pytest\): FAIL \(exit 1\): 1 failed, 1 passed(, \d+ warnings?)? in ",
        lines[-3],
    ), lines[-3]
    assert re.match(
        r"ci: stress \(ci profile\): FAIL \(exit 1\): 1 failed, 1 passed(, \d+ warnings?)? in ",
        lines[-2],
    ), lines[-2]
    assert lines[-1] == "ci: FAIL: tests FAIL (exit 1), stress (ci profile) FAIL (exit 1)"


ODDLY_NAMED_FAILURES = """
import pytest

pytestmark = pytest.mark.stress


@pytest.mark.parametrize("case", ["two words", "it's", "a[1, 2]"])
def test_oddly_named(case):
    assert case == "never"
"""


def test_nightly_report_reproduces_test_ids_with_spaces_and_quotes(tmp_path: Path) -> None:
    # Stress ids such as test_sweep[checkpoints and deletion-12of12] or
    # test_matrix[durable_mkdir['a/b/c', 'a/d', 'e']-posix]: the report's command was cut at
    # the first space, and a quote ended its quoting.
    root = fake_project(tmp_path / "project", ODDLY_NAMED_FAILURES)
    result = run_script(root, "nightly.sh")
    assert result.returncode == 1, result.stdout + result.stderr
    report = (root / "nightly-logs" / "report-shard-0.md").read_text()
    commands = [line for line in report.splitlines() if "python -m pytest --run-stress" in line]
    assert len(commands) == 3, report
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYPOTHESIS_"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    ran = set()
    for command in commands:
        rerun = subprocess.run(
            ["bash", "-c", command + " -p no:xdist -rf"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=SCRIPT_TIMEOUT_S,
        )
        assert rerun.returncode == 1, command + "\n" + rerun.stdout + rerun.stderr
        assert "1 failed" in rerun.stdout, command + "\n" + rerun.stdout
        ran |= {case for case in ("two words", "it's", "a[1, 2]") if f"[{case}]" in rerun.stdout}
    assert ran == {"two words", "it's", "a[1, 2]"}


SLOW_FUZZER = """
import time

import pytest
from hypothesis import given, strategies as st

pytestmark = pytest.mark.stress


@pytest.mark.timeout(3, func_only=True)  # the call only: setup's imports vary with the load
@given(st.integers())
def test_slow_fuzzer(n):
    time.sleep(0.1)


def test_the_next_test_still_runs():
    pass
"""


def test_a_fuzzer_over_its_cap_fails_as_a_timeout_not_as_flaky(tmp_path: Path) -> None:
    # 200 examples of 100 ms against a 3 s cap. pytest-timeout's own Failed("Timeout") was
    # taken by Hypothesis for a failing example, and the replay, which ends in time, made it
    # "FlakyStrategyDefinition: Inconsistent data generation!" or "FlakyFailure".
    root = fake_project(tmp_path / "project", SLOW_FUZZER)
    # the fuzz budget off: it would stop the fuzzer at 80% of its cap (test_fuzz_budget.py)
    result = run_script(root, "nightly.sh", NIGHTLY_BUDGET_S="0")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Flaky" not in result.stdout, result.stdout
    cap = "StressTestTimeout: tests/stress/test_fake.py::test_slow_fuzzer ran past its per-test cap"
    assert f"{cap} of 3 s" in result.stdout, result.stdout
    report = (root / "nightly-logs" / "report-shard-0.md").read_text()
    assert "- FAILED tests/stress/test_fake.py::test_slow_fuzzer" in report
    assert "1 failed, 1 passed" in result.stdout  # the session went on
    # the example in flight did not fail: nothing to replay
    assert not list((root / ".hypothesis").glob("examples/*/*"))


FOUND_THEN_SLOW = """
import time

import pytest
from hypothesis import given, strategies as st

pytestmark = pytest.mark.stress


@given(st.integers(min_value=0, max_value=1000))
def test_finds_a_bug(n):
    assert n < 500


def test_still_running():
    time.sleep(300)
"""


def test_a_nightly_shard_cut_short_by_a_cancel_still_reports(tmp_path: Path) -> None:
    # A cancel or the job's timeout-minutes: SIGINT, SIGTERM 7.5 s later, SIGKILL. The shard
    # had found a bug, but the script waited on pytest and died with it: no report.
    root = fake_project(tmp_path / "project", FOUND_THEN_SLOW)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYPOTHESIS_"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update({"NIGHTLY_WORKERS": "0", "HYPOTHESIS_PROFILE": "default"})

    def default_sigint() -> None:  # as on a runner: a background job here starts ignoring it
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    log = root / "nightly-logs" / "shard-0.log"
    with subprocess.Popen(
        ["bash", str(root / "ci" / "nightly.sh")],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
        start_new_session=True,
    ) as shard:
        try:
            deadline = time.monotonic() + SCRIPT_TIMEOUT_S
            while "test_still_running" not in (log.read_text() if log.exists() else ""):
                assert shard.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            shard.send_signal(signal.SIGINT)  # to the script alone, as the runner does
            out, err = shard.communicate(timeout=30)
        finally:
            if shard.poll() is None:
                os.killpg(shard.pid, signal.SIGKILL)
    assert shard.returncode == 130, out + err
    assert "cut short by SIGINT" in err
    report = (root / "nightly-logs" / "report-shard-0.md").read_text()
    assert "cut short: shard 0 of 1" in report
    assert "FAILED" in report and "test_finds_a_bug" in report.split("### Replay")[0]
    assert "'tests/stress/test_fake.py::test_still_running'" in report
    assert list((root / ".hypothesis").glob("examples/*/*")), "the found bug is in the corpus"
    try:  # pytest got SIGTERM from the script; give it a moment to go
        deadline = time.monotonic() + 30
        while _session_processes(shard.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _session_processes(shard.pid), "pytest outlived the script"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shard.pid, signal.SIGKILL)


def _session_processes(session: int) -> list[str]:
    found = subprocess.run(["ps", "-s", str(session), "-o", "stat=,args="], capture_output=True)
    return [line for line in found.stdout.decode().splitlines() if not line.startswith("Z")]
