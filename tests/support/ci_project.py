"""A throw-away project that runs the ci/ scripts (nightly.sh, stress.sh) against the
oracle under test, free of the calling run's pytest and Hypothesis settings."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.hypothesis_constants import share_constants
from tests.support.unused_plugins import PYTEST_INI

REPO = Path(__file__).resolve().parents[2]
SCRIPT_TIMEOUT_S = 120


def fake_project(root: Path, tests: str | None) -> Path:
    (root / "ci").mkdir(parents=True)
    for script in ("nightly.sh", "stress.sh"):
        shutil.copy2(REPO / "ci" / script, root / "ci" / script)
    # the stress gate and profiles come from the project's own conftest, as in substrat
    shutil.copy2(REPO / "conftest.py", root / "conftest.py")
    (root / "pytest.ini").write_text(PYTEST_INI)
    (root / "tests" / "stress").mkdir(parents=True)
    if tests is not None:
        (root / "tests" / "stress" / "test_fake.py").write_text(tests)
    share_constants(root)  # its children read substrat's constants, not parse them again
    return root


def run_script(root: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_in(root, ["bash", str(root / "ci" / script)], **env)


def run_in(root: Path, command: list[str], **env: str) -> subprocess.CompletedProcess[str]:
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
