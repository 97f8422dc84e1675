"""The CLI tests drive the ``substrat`` of the Python under test, not PATH's first one.

Run as ``venv/bin/python -m pytest`` with the venv not on PATH, ``shutil.which``
found a pyenv shim to the image's Python, whose editable install was another
checkout: 43 test files ran that program (or skipped as "not installed") and
the README guide's shell did too. Here a fake ``substrat`` comes first on PATH
and must not be the one chosen.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support.cli import NOT_INSTALLED, SUBSTRAT

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason=NOT_INSTALLED)


@pytest.fixture
def fake_first_on_path(tmp_path: Path) -> tuple[Path, str]:
    fake_dir = tmp_path / "elsewhere"
    fake_dir.mkdir()
    fake = fake_dir / "substrat"
    fake.write_text("#!/bin/sh\necho fake substrat\n")
    fake.chmod(0o755)
    return fake, os.pathsep.join([str(fake_dir), os.environ.get("PATH", os.defpath)])


def test_the_script_is_this_pythons_even_with_another_first_on_path(
    fake_first_on_path: tuple[Path, str],
) -> None:
    fake, path = fake_first_on_path
    run = subprocess.run(
        [sys.executable, "-c", "from tests.support.cli import SUBSTRAT; print(SUBSTRAT)"],
        cwd=ROOT,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    chosen = run.stdout.strip()
    assert chosen != str(fake)
    assert chosen == SUBSTRAT
    scripts = {sysconfig.get_path("scripts"), sysconfig.get_path("scripts", f"{os.name}_user")}
    assert os.path.dirname(chosen) in scripts


def test_the_guides_shell_runs_the_script_under_test(
    tmp_path: Path, fake_first_on_path: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.integration.test_readme_guide import guide_env

    _, path = fake_first_on_path
    monkeypatch.setenv("PATH", path)
    found = subprocess.run(
        ["bash", "-c", "command -v substrat"],
        env=guide_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.stdout.strip() == SUBSTRAT
