"""Installed on a system without POSIX calls, faultfs must not break the project's tests.

The distribution registers faultfs's pytest plugin in every pytest run of the
project that installs it. Where faultfs cannot run (Windows: no ``fcntl``), the
plugin skips the tests that use its fixtures, saying why, and every other test
runs; importing faultfs's API says why instead of failing inside on ``fcntl``.
Simulated here the way such a system looks to Python: ``fcntl`` cannot be
imported (``sys.modules["fcntl"] = None``); a real Windows machine is not
available to these tests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BLOCKED = "import sys; sys.modules['fcntl'] = None; "

PROJECT = {
    "test_unrelated.py": "def test_unrelated():\n    assert 1 + 1 == 2\n",
    "test_crash.py": (
        "def test_save(faultfs):\n"
        "    raise AssertionError('a faultfs test ran where faultfs cannot')\n\n"
        "def test_explore(faultfs_explore):\n"
        "    raise AssertionError('a faultfs test ran where faultfs cannot')\n"
    ),
}


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKED + code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_project_pytest_run_keeps_working_and_faultfs_tests_skip(tmp_path: Path) -> None:
    for name, text in PROJECT.items():
        (tmp_path / name).write_text(text)
    # pyfakefs's own plugin imports fcntl too (it has its own Windows path): left out here
    args = ["-q", "-rs", "-p", "no:cacheprovider", "-p", "no:fakefs", "--strict-markers", "."]
    proc = _python(f"import pytest; sys.exit(pytest.main({args!r}))", tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "1 passed, 2 skipped" in out, out
    assert out.count("faultfs needs a POSIX system") == 2, out


def test_importing_the_api_says_why(tmp_path: Path) -> None:
    for statement in (
        "from faultfs import FaultFS",
        "from faultfs.stateful import CrashStateMachine",
        "import faultfs.pytest_plugin",
    ):
        proc = _python(
            f"""
try:
    {statement}
except ImportError as exc:
    print(exc)
else:
    print('imported')
""",
            tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("faultfs needs a POSIX system"), (statement, proc.stdout)
        assert "no module 'fcntl'" in proc.stdout, proc.stdout
