"""Installing the distribution adds only faultfs's fixtures and marker to other projects.

A scratch project with its own ``stress`` marker, its own ``--run-stress``
option and its own Hypothesis settings is run by pytest in a subprocess, once
as it is (the distribution's pytest plugins load through their entry points)
and once with every plugin of the distribution blocked (as if substrat were
not installed). Collection, outcomes, skip reasons and the Hypothesis settings
the tests saw must be the same.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

RUN_TIMEOUT_S = 120

SCRATCH_INI = """\
[pytest]
markers =
    stress: the scratch project's own slow tests
"""

SCRATCH_CONFTEST = """\
import json
import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--run-stress", action="store_true", default=False,
                     help="the scratch project's own switch")


def pytest_collection_finish(session):
    with open(os.environ["SCRATCH_PLUGINS"], "w") as out:
        json.dump({
            "faultfs": session.config.pluginmanager.has_plugin("faultfs"),
            "collected": [item.nodeid for item in session.items],
        }, out)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-stress"):
        return
    for item in items:
        if "stress" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="scratch: stress is off"))
"""

SCRATCH_TESTS = """\
import json
import os

import pytest
from hypothesis import given, settings, strategies as st


def record(name, **seen):
    with open(os.environ["SCRATCH_SEEN"], "a") as out:
        out.write(json.dumps({"test": name, **seen}, sort_keys=True) + "\\n")


def current():
    s = settings.default
    return {
        "max_examples": s.max_examples,
        "derandomize": s.derandomize,
        "deadline": str(s.deadline),
        "stateful_step_count": s.stateful_step_count,
        "database": type(s.database).__name__,
        "suppressed": sorted(h.name for h in s.suppress_health_check),
    }


def test_plain():
    record("plain")


@pytest.mark.stress
def test_long():
    record("long")


EXAMPLES = []


@given(st.integers())
def test_hypothesis_defaults(n):
    EXAMPLES.append(n)


def test_defaults_seen():
    record("defaults", examples=len(EXAMPLES), **current())


@settings(max_examples=7, database=None)
@given(st.integers())
def test_own_settings(n):
    record("own", **current())
"""


def _substrat_plugin_names() -> list[str]:
    eps = metadata.distribution("substrat").entry_points
    return sorted(ep.name for ep in eps if ep.group == "pytest11")


def _scratch(tmp_path: Path) -> Path:
    project = tmp_path / "scratch"
    project.mkdir()
    (project / "pytest.ini").write_text(SCRATCH_INI)
    (project / "conftest.py").write_text(SCRATCH_CONFTEST)
    (project / "test_scratch.py").write_text(SCRATCH_TESTS)
    return project


def _run(project: Path, args: list[str], *, env_extra: dict[str, str], blocked: list[str]) -> dict:
    """One pytest run of the scratch project: what it collected, its outcomes, what tests saw."""
    out = project.parent / "out"
    out.mkdir(exist_ok=True)
    seen = out / "seen.jsonl"
    plugins = out / "plugins.json"
    for f in (seen, plugins):
        f.unlink(missing_ok=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "HYPOTHESIS_")) and k not in ("CI", "COV_CORE_SOURCE")
    }
    env.update(env_extra, SCRATCH_SEEN=str(seen), SCRATCH_PLUGINS=str(plugins))
    block = [a for name in blocked for a in ("-p", f"no:{name}")]
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", *block, *args]
    result = subprocess.run(
        cmd, cwd=project, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    lines = result.stdout.splitlines()
    outcomes = sorted(
        re.sub(r"\s+\(.*\)$", "", line)
        for line in lines
        if line.startswith(("PASSED ", "FAILED ", "SKIPPED ", "ERROR ", "XFAIL ", "XPASS "))
    )
    records = sorted(seen.read_text().splitlines()) if seen.exists() else []
    config = json.loads(plugins.read_text()) if plugins.exists() else {}
    return {
        "exit": result.returncode,
        "stderr_tail": result.stderr.strip().splitlines()[-3:],
        "collected": config.get("collected"),
        "outcomes": outcomes,
        "seen": sorted(set(records)),
        "faultfs_loaded": config.get("faultfs"),
    }


@pytest.mark.parametrize(
    ("ci", "stress"), [(False, False), (True, True)], ids=["local", "CI=true,--run-stress"]
)
def test_a_project_with_its_own_stress_gate_runs_the_same_with_substrat_installed(
    tmp_path: Path, ci: bool, stress: bool
) -> None:
    names = _substrat_plugin_names()
    assert "faultfs" in names, f"the distribution's pytest11 entry points are {names}"
    project = _scratch(tmp_path)
    args = ["--run-stress"] if stress else []
    env = {"CI": "true"} if ci else {}
    installed = _run(project, args, env_extra=env, blocked=[])
    absent = _run(project, args, env_extra=env, blocked=names)

    for key in ("exit", "collected", "outcomes", "seen"):
        assert installed[key] == absent[key], (key, installed, absent)
    assert absent["exit"] == 0, absent
    assert absent["faultfs_loaded"] is False, absent
    assert installed["faultfs_loaded"] is True, installed  # what installing does add
    ran_long = "PASSED test_scratch.py::test_long" in absent["outcomes"]
    skipped_long = any(o.endswith("scratch: stress is off") for o in absent["outcomes"])
    assert (ran_long, skipped_long) == (stress, not stress), absent["outcomes"]
