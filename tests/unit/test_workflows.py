"""The GitHub workflows parse, follow the Actions schema, and call ci/ scripts that exist.

Also runs the ci/ scripts the workflows call on a throw-away project tree, to
show that nightly sharding partitions the stress tests and that a failure
leaves a report with the reproduction.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.unused_plugins import PYTEST_INI

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS_DIR = REPO / ".github" / "workflows"
# A ci/ script named as a command word, e.g. `ci/tests.sh` or `./ci/nightly.sh --x`.
CI_SCRIPT_REF = re.compile(r"(?<![\w./-])(?:\./)?(ci/[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*)")
SCRIPT_TIMEOUT_S = 120


def _workflow_files() -> list[Path]:
    return sorted([*WORKFLOWS_DIR.glob("*.yml"), *WORKFLOWS_DIR.glob("*.yaml")])


def _load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), f"{path.name} is not a mapping"
    return doc


def _triggers(doc: dict[str, Any]) -> Any:
    # YAML 1.1 (PyYAML) reads a bare `on` key as the boolean True.
    return doc["on"] if "on" in doc else doc.get(True)


def _steps(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for job_name, job in doc["jobs"].items():
        for step in job.get("steps", []):
            yield job_name, step


def _runs(doc: dict[str, Any]) -> list[str]:
    return [step["run"] for _, step in _steps(doc) if "run" in step]


def test_workflows_exist_and_parse() -> None:
    names = {path.name for path in _workflow_files()}
    assert {"pr.yml", "nightly.yml"} <= names
    for path in _workflow_files():
        doc = _load(path)
        assert _triggers(doc), f"{path.name} has no triggers"
        assert doc.get("jobs"), f"{path.name} has no jobs"
        for job_name, job in doc["jobs"].items():
            assert "runs-on" in job, f"{path.name}: job {job_name} has no runs-on"
            assert job.get("timeout-minutes"), f"{path.name}: job {job_name} is unbounded"
            for step in job["steps"]:
                assert ("run" in step) != ("uses" in step), f"{path.name}: {step}"


def test_every_ci_script_a_workflow_calls_exists_and_is_executable() -> None:
    referenced: set[str] = set()
    for path in _workflow_files():
        for run in _runs(_load(path)):
            referenced.update(CI_SCRIPT_REF.findall(run))
    assert {"ci/tests.sh", "ci/stress.sh", "ci/nightly.sh"} <= referenced
    for script in sorted(referenced):
        target = REPO / script
        assert target.is_file(), f"a workflow runs {script}, which does not exist"
        assert os.access(target, os.X_OK), f"{script} is not executable"
        assert target.read_text().startswith("#!"), f"{script} has no shebang"


def test_the_script_reference_pattern_finds_commands_not_lookalikes() -> None:
    run = (
        "ci/tests.sh\nbash ./ci/stress.sh -x\nHYPOTHESIS_PROFILE=ci ci/nightly.sh\necho magic/ci/x"
    )
    assert CI_SCRIPT_REF.findall(run) == ["ci/tests.sh", "ci/stress.sh", "ci/nightly.sh"]


def test_every_ci_script_is_valid_bash() -> None:
    scripts = sorted((REPO / "ci").glob("*.sh"))
    assert scripts
    for script in scripts:
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script.name}: {result.stderr}"


def test_pr_gate_runs_the_tests_then_the_stress_suite_under_the_ci_profile() -> None:
    doc = _load(WORKFLOWS_DIR / "pr.yml")
    triggers = _triggers(doc)
    assert "push" in triggers and "pull_request" in triggers
    steps = [step for _, step in _steps(doc)]
    runs = [step.get("run", "") for step in steps]
    tests_at = next(i for i, run in enumerate(runs) if "ci/tests.sh" in run)
    stress_at = next(i for i, run in enumerate(runs) if "ci/stress.sh" in run)
    assert tests_at < stress_at
    assert steps[stress_at]["env"]["HYPOTHESIS_PROFILE"] == "ci"


RESULTS = ("success", "failure", "cancelled", "skipped")
"""What ``needs.<job>.result`` can be."""


def _job_condition(condition: str, values: dict[str, str]) -> bool:
    """A job's ``if:`` of the shape ``always() && a != 'x' && ...``, evaluated for ``values``.

    Only that shape (and ``||``, parentheses, ``failure()``): anything else fails here
    rather than being guessed at. A job-level ``always()`` is true after failures and
    cancels; ``failure()`` only when a needed job failed (``needs.fuzz.result``).
    """
    text = condition.strip()
    if text.startswith("${{") and text.endswith("}}"):
        text = text[3:-2]
    tokens = re.findall(r"\s*(\|\||&&|==|!=|\(|\)|always\(\)|failure\(\)|'[^']*'|[\w.]+)", text)
    assert "".join(tokens).replace(" ", "") == text.replace(" ", ""), f"unknown syntax: {text}"
    python = []
    for token in (t.strip() for t in tokens):
        if token in ("&&", "||"):
            python.append(" and " if token == "&&" else " or ")
        elif token == "always()":
            python.append("True")
        elif token == "failure()":
            python.append(repr(values["needs.fuzz.result"] == "failure"))
        elif token in ("==", "!=", "(", ")") or token.startswith("'"):
            python.append(token)
        else:
            assert token in values, f"no value for {token}"
            python.append(repr(values[token]))
    return bool(eval("".join(python), {"__builtins__": {}}))  # only the tokens above


def test_nightly_is_scheduled_sharded_cached_and_files_issues() -> None:
    doc = _load(WORKFLOWS_DIR / "nightly.yml")
    triggers = _triggers(doc)
    assert triggers["schedule"][0]["cron"]
    assert "workflow_dispatch" in triggers
    assert doc["env"]["HYPOTHESIS_PROFILE"] == "nightly"

    fuzz = doc["jobs"]["fuzz"]
    shards = fuzz["strategy"]["matrix"]["shard"]
    assert len(shards) > 1
    assert shards == list(range(int(doc["env"]["SHARD_COUNT"])))
    assert fuzz["strategy"]["fail-fast"] is False

    steps = fuzz["steps"]
    restore = next(s for s in steps if s.get("uses", "").startswith("actions/cache/restore"))
    assert restore["with"]["path"] == ".hypothesis"
    assert "github.ref_name" in restore["with"]["key"]
    assert "steps.date.outputs.date" in restore["with"]["key"]
    assert "hypothesis-${{ github.ref_name }}-" in restore["with"]["restore-keys"]
    run = next(s for s in steps if "ci/nightly.sh" in s.get("run", ""))
    assert run["env"]["SHARD_INDEX"] == "${{ matrix.shard }}"
    assert "HYPOTHESIS_REDIS_URL" in run["env"]

    corpus = doc["jobs"]["corpus"]
    assert corpus["needs"] == "fuzz" and corpus["if"] == "always()"
    save = next(s for s in corpus["steps"] if s.get("uses", "").startswith("actions/cache/save"))
    assert save["with"]["key"] == restore["with"]["key"]

    report = doc["jobs"]["report"]
    # GitHub concludes a job stopped by timeout-minutes as cancelled: failure() is false then
    runs_on = {r for r in RESULTS if _job_condition(report["if"], {"needs.fuzz.result": r})}
    assert runs_on == {"failure", "cancelled"}, report["if"]
    assert report["needs"] == "fuzz"
    assert report["permissions"]["issues"] == "write"
    script = next(s for s in report["steps"] if "github-script" in s.get("uses", ""))
    body = script["with"]["script"]
    assert "issues.create(" in body and "issues.createComment(" in body
    assert "report-shard-" in body


def test_powerloss_runs_on_a_lazyfs_runner_requires_lazyfs_and_never_builds_it() -> None:
    doc = _load(WORKFLOWS_DIR / "powerloss.yml")
    triggers = _triggers(doc)
    assert triggers["schedule"][0]["cron"]
    assert "workflow_dispatch" in triggers
    job = doc["jobs"]["powerloss"]
    assert {"self-hosted", "lazyfs"} <= set(job["runs-on"])
    step = next(s for _, s in _steps(doc) if "ci/powerloss.sh" in s.get("run", ""))
    # Missing LazyFS on that runner must fail the job, and LAZYFS_BIN comes from the runner.
    assert step["env"]["POWERLOSS_REQUIRE_LAZYFS"] == "1"
    assert "LAZYFS_BIN" not in step["env"]
    for run in _runs(doc):
        assert not re.search(r"\b(cmake|make|g\+\+|git clone|apt-get)\b", run), run
    labels = yaml.safe_load((REPO / ".github" / "actionlint.yaml").read_text())
    assert "lazyfs" in labels["self-hosted-runner"]["labels"]


def test_workflows_match_the_github_actions_schema() -> None:
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.skip("check-jsonschema is not installed (pip install -e '.[dev]' brings it)")
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows"]
        + [str(path) for path in _workflow_files()],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _dev_tool(name: str) -> str:
    """A linter the ``dev`` extra installs as a wheel with its binary (next to this Python)."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which(name, path=search)
    assert found, f"{name} is missing: pip install -e '.[dev]' installs it (a PyPI wheel)"
    return found


def test_zizmor_finds_nothing_in_the_workflows() -> None:
    """zizmor, a GitHub Actions linter and security auditor: pinned actions, no credentials
    left in the checkout, no template injection, least-privilege permissions."""
    result = subprocess.run(
        [_dev_tool("zizmor"), "--offline", "--no-progress", str(WORKFLOWS_DIR)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_accepts_the_ci_scripts() -> None:
    scripts = [str(p) for p in sorted((REPO / "ci").glob("*.sh"))] + [str(REPO / ".ci" / "run")]
    result = subprocess.run(
        [_dev_tool("shellcheck"), *scripts], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout


def test_mutants_run_weekly_and_on_demand_and_keep_their_table() -> None:
    from oracle import mutants

    doc = _load(WORKFLOWS_DIR / "mutants.yml")
    triggers = _triggers(doc)
    assert triggers["schedule"][0]["cron"].split()[4] != "*", "weekly, not daily"
    assert "workflow_dispatch" in triggers
    steps = doc["jobs"]["mutants"]["steps"]
    runs = [s.get("run", "") for s in steps]
    assert any("pip install -e '.[dev]'" in run for run in runs)
    run = next(s for s in steps if "ci/mutants.sh" in s.get("run", ""))
    assert run["env"]["HYPOTHESIS_PROFILE"] == "ci"
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()"
    assert upload["with"]["path"].rstrip("/") == run["env"]["MUTANT_OUT"]
    script = (REPO / "ci" / "mutants.sh").read_text()
    assert script.index("catalog") < script.index("--systematic")
    assert '--markdown "$out/$kind.md"' in script
    # the persistence fuzzer, the cheapest killer, runs first in both kinds
    assert mutants.DEFAULT_TESTS[0] == mutants.SYSTEMATIC_TESTS[0]
    assert mutants.DEFAULT_TESTS[0] == "tests/stress/test_persistence_fuzz.py"
    for path in mutants.SYSTEMATIC_TESTS:
        assert (REPO / path).exists(), f"the systematic run names {path}, which does not exist"


# -- the scripts themselves, on a throw-away project ------------------------------

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


def _fake_project(root: Path, tests: str | None) -> Path:
    (root / "ci").mkdir(parents=True)
    for script in ("nightly.sh", "stress.sh"):
        shutil.copy2(REPO / "ci" / script, root / "ci" / script)
    # the stress gate and profiles come from the project's own conftest, as in substrat
    shutil.copy2(REPO / "conftest.py", root / "conftest.py")
    (root / "pytest.ini").write_text(PYTEST_INI)
    (root / "tests" / "stress").mkdir(parents=True)
    if tests is not None:
        (root / "tests" / "stress" / "test_fake.py").write_text(tests)
    return root


def _run_script(root: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return _run_in(root, ["bash", str(root / "ci" / script)], **env)


def _run_in(root: Path, command: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``command`` in the fake project ``root``, free of this run's pytest and profile."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYPOTHESIS_"))}
    # the scripts run `python`: this one, whose oracle is the one under test
    base["PATH"] = os.path.dirname(sys.executable) + os.pathsep + base.get("PATH", "")
    base.update({"NIGHTLY_WORKERS": "0", "STRESS_WORKERS": "0", "HYPOTHESIS_PROFILE": "default"})
    base.update(env)
    return subprocess.run(
        command,
        cwd=root,
        env=base,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )


def test_nightly_shards_partition_the_stress_tests_and_report_failures(tmp_path: Path) -> None:
    root = _fake_project(tmp_path / "project", FAKE_STRESS_TESTS)
    results = {
        i: _run_script(root, "nightly.sh", SHARD_INDEX=str(i), SHARD_COUNT="2") for i in (0, 1)
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
    root = _fake_project(tmp_path / "project", FAKE_STRESS_TESTS)
    for index, count in (("2", "2"), ("-1", "2"), ("0", "0"), ("x", "3")):
        result = _run_script(root, "nightly.sh", SHARD_INDEX=index, SHARD_COUNT=count)
        assert result.returncode == 2
        assert "0 <= SHARD_INDEX < SHARD_COUNT" in result.stderr


def test_a_nightly_shard_with_nothing_to_run_succeeds(tmp_path: Path) -> None:
    root = _fake_project(tmp_path / "project", FAKE_STRESS_TESTS)
    result = _run_script(root, "nightly.sh", SHARD_INDEX="7", SHARD_COUNT="8")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "runs 0 of 6 stress tests" in result.stdout
    assert "nothing for this shard to run" in result.stdout


def test_stress_gate_uses_the_ci_profile_and_fails_when_it_ran_nothing(tmp_path: Path) -> None:
    empty = _fake_project(tmp_path / "empty", None)
    env = {"HYPOTHESIS_PROFILE": ""}  # unset: the script must choose `ci` itself
    result = _run_script(empty, "stress.sh", **env)
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
    root = _fake_project(tmp_path / "project", ODDLY_NAMED_FAILURES)
    result = _run_script(root, "nightly.sh")
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
    root = _fake_project(tmp_path / "project", SLOW_FUZZER)
    # the fuzz budget off: it would stop the fuzzer at 80% of its cap (test_fuzz_budget.py)
    result = _run_script(root, "nightly.sh", NIGHTLY_BUDGET_S="0")
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
    root = _fake_project(tmp_path / "project", FOUND_THEN_SLOW)
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
