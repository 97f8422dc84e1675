"""The GitHub workflows parse, follow the Actions schema, and call ci/ scripts that exist.

The scripts themselves, run on a throw-away project: tests/unit/test_ci_scripts.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

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
