"""The project's own pytest settings: a run's closing summary names what went wrong.

pytest's ``-r`` flag replaces its default (``fE``) rather than adding to it, so an
``addopts`` of ``-rs`` alone left a failing run's summary with the skip reasons and
without the name of the test that failed: a newcomer whose run went red had to dig
the name out of the tracebacks (or out of ``.pytest_cache``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.support.pytest_run import run_pytest

ROOT = Path(__file__).resolve().parents[2]

FAILING_PROJECT = """
import pytest

def test_that_fails():
    assert 1 == 2

@pytest.fixture
def broken():
    raise RuntimeError("fixture down")

def test_with_a_broken_fixture(broken):
    pass

@pytest.mark.skip(reason="the reason the summary must show")
def test_skipped():
    pass
"""


def test_a_red_run_names_its_failures_errors_and_skip_reasons(tmp_path: Path) -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    addopts = options["ini_options"]["addopts"]
    (tmp_path / "pytest.ini").write_text(f"[pytest]\naddopts = {addopts}\n")
    (tmp_path / "test_red.py").write_text(FAILING_PROJECT)
    result = run_pytest(tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    summary = out.split("short test summary info")[-1]
    assert "FAILED test_red.py::test_that_fails" in summary, out[-3000:]
    assert "ERROR test_red.py::test_with_a_broken_fixture" in summary, out[-3000:]
    assert "the reason the summary must show" in summary, out[-3000:]
