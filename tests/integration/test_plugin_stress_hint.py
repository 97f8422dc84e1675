"""``pytest --run-stress`` in a project that installed substrat says how to get the option.

The distribution's entry point registers only faultfs's fixtures, so argparse
used to answer a newcomer who followed the README's main job in their own
project with a bare "unrecognized arguments: --run-stress". The entry point
now says where the option is (``-p oracle.pytest_plugin``) without registering
it: with oracle's plugin loaded, or the project's own ``--run-stress`` (see
test_plugin_hygiene.py), the option is parsed as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RUN_TIMEOUT_S = 120


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "HYPOTHESIS_")) and k not in ("CI", "COV_CORE_SOURCE")
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def _project(tmp_path: Path, conftest: str = "") -> Path:
    project = tmp_path / "scratch"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_it.py").write_text("def test_it():\n    pass\n")
    if conftest:
        (project / "conftest.py").write_text(conftest)
    return project


def test_run_stress_without_oracles_plugin_says_how_to_load_it(tmp_path: Path) -> None:
    proc = _pytest(_project(tmp_path), "--run-stress", "--fuzz-budget=60")
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert "--run-stress and --fuzz-budget: substrat's own stress-test option" in proc.stderr
    assert "`-p oracle.pytest_plugin`" in proc.stderr
    assert "unrecognized arguments" not in proc.stderr
    assert "needs Hypothesis" not in proc.stderr  # installed here


def test_without_hypothesis_it_says_to_install_it(tmp_path: Path) -> None:
    # find_spec answers None for a module set to None in sys.modules, as when it is missing
    project = _project(tmp_path, "import sys\nsys.modules['hypothesis'] = None\n")
    proc = _pytest(project, "-p", "no:hypothesispytest", "--run-stress")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "which needs Hypothesis (pip install hypothesis)" in proc.stderr


def test_with_oracles_plugin_the_option_works(tmp_path: Path) -> None:
    proc = _pytest(_project(tmp_path), "-p", "oracle.pytest_plugin", "--run-stress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


def test_help_and_other_unknown_options_are_pytests_own(tmp_path: Path) -> None:
    project = _project(tmp_path)
    assert _pytest(project, "--run-stress", "--help").returncode == 0
    proc = _pytest(project, "--no-such-option")
    assert proc.returncode == 4
    assert "unrecognized arguments: --no-such-option" in proc.stderr
    assert "substrat" not in proc.stderr
