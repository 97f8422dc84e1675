"""The stress gate of oracle.pytest_plugin: a stress test's time cap.

The project's ``timeout`` (300 s, pyproject.toml) is a hang guard for quick
tests; a stress test run by the README's main job (``pytest --run-stress``)
gets ``STRESS_TEST_TIMEOUT_S`` instead, unless ``--timeout`` or its own marker
says otherwise. Run in a throw-away project, in a child pytest that opts in
to the plugin with ``-p oracle.pytest_plugin`` (installing the distribution
does not register it; substrat's own rootdir conftest loads it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from oracle.pytest_plugin import STRESS_TEST_TIMEOUT_S
from tests.support.unused_plugins import PYTEST_ARGS

CHILD_TIMEOUT_S = 120

PROJECT_INI = """
[pytest]
timeout = 300
"""

TESTS = """
import pytest


def _cap(request):
    marker = request.node.get_closest_marker("timeout")
    return None if marker is None else marker.args[0]


@pytest.mark.stress
def test_stress_without_a_marker(request):
    print("cap", "stress", _cap(request))


@pytest.mark.stress
@pytest.mark.timeout(42)
def test_stress_with_its_own_marker(request):
    print("cap", "own", _cap(request))


def test_quick(request):
    print("cap", "quick", _cap(request))
"""


def _caps(tmp_path: Path, *args: str) -> dict[str, str]:
    (tmp_path / "pytest.ini").write_text(PROJECT_INI)
    (tmp_path / "test_caps.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", *PYTEST_ARGS]
        + ["-p", "oracle.rewrite_scope", "-p", "oracle.pytest_plugin", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(re.findall(r"cap (stress|own|quick) (\S+)", result.stdout))


def test_a_stress_test_gets_the_stress_cap_not_the_quick_tests_timeout(tmp_path: Path) -> None:
    caps = _caps(tmp_path, "--run-stress")
    assert caps == {"stress": str(STRESS_TEST_TIMEOUT_S), "own": "42", "quick": "None"}
    assert STRESS_TEST_TIMEOUT_S > 300


def test_an_explicit_timeout_wins_over_the_stress_cap(tmp_path: Path) -> None:
    caps = _caps(tmp_path, "--run-stress", "--timeout", "600")
    assert caps == {"stress": "None", "own": "42", "quick": "None"}


def _header(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text(PROJECT_INI)
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYPOTHESIS_"))}
    base.pop("CI", None)
    # --collect-only: the header and the profile come before any test, and a test run would
    # only add the plugin's import of every project module first (about half a CPU s)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-p", "no:cacheprovider", *PYTEST_ARGS]
        + ["-p", "oracle.pytest_plugin"],
        cwd=tmp_path,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )


def test_a_misspelled_profile_is_refused_naming_the_profiles(tmp_path: Path) -> None:
    # It was a Hypothesis traceback under "Error while loading plugin", ending in
    # "Profile 'nighlty' is not registered".
    result = _header(tmp_path, HYPOTHESIS_PROFILE="nighlty")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "HYPOTHESIS_PROFILE='nighlty' is not a Hypothesis profile" in result.stderr
    assert "default (local runs), ci (derandomized" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("ci", "profile"), [("true", "ci"), ("1", "ci"), ("false", "default"), ("0", "default")]
)
def test_ci_false_is_not_ci(tmp_path: Path, ci: str, profile: str) -> None:
    result = _header(tmp_path, CI=ci)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"substrat: hypothesis profile={profile}," in result.stdout
