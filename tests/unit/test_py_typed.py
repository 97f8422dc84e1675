"""The distribution ships PEP 561 markers, so a user's mypy checks against substrat's types.

An outside review type-checked its own program (``from substrat.orchestrator
import Orchestrator``) with ``mypy --strict`` against the installed package and got
``module is installed, but missing library stubs or py.typed marker``: every
substrat name was ``Any`` to it. This builds the packages as an install would
(setuptools' ``build_py`` from a copy of the project's configuration and
packages) and looks for the marker in what it built.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_built_packages_carry_py_typed(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    for pkg in ("substrat", "faultfs"):  # oracle ships no marker: it is substrat's own test kit
        shutil.copytree(
            ROOT / pkg, project / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    out = tmp_path / "built"
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "from setuptools import setup; setup()",
            "-q",
            "build_py",
            "--build-lib",
            str(out),
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr
    for package in ("substrat", "faultfs"):
        assert (out / package / "__init__.py").is_file()
        assert (out / package / "py.typed").is_file(), f"{package}/py.typed is not installed"
