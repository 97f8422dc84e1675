"""tests/faultfs_example runs as another project would run it: out of this tree.

The example directory is copied to a scratch directory (no conftest, no
pyproject of this repository above it) and its tests run there with the
installed distribution: the notes app with the faultfs fixtures, and the
key-value store's crash-recovery state machine, whose planted bug must be
found and shrunk. Its sources may use only faultfs's public API.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tests.support.pytest_run import run_pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "faultfs_example"
PUBLIC = ("faultfs", "faultfs.errors", "faultfs.stateful", "faultfs.pytest_plugin")


def test_the_example_uses_only_the_public_api() -> None:
    for source in EXAMPLE.glob("*.py"):
        text = source.read_text()
        imported = re.findall(r"^\s*(?:from|import)\s+([\w.]+)", text, re.MULTILINE)
        ours = [
            name
            for name in imported
            if name.split(".")[0] in ("faultfs", "substrat", "oracle", "tests")
        ]
        assert all(name in PUBLIC for name in ours), f"{source.name} imports {ours}"


def test_the_example_project_passes_out_of_tree(tmp_path: Path) -> None:
    project = tmp_path / "example"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    result = run_pytest(project, "-s", timeout_s=600)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert re.search(r"\b6 passed\b", out), out
    # The shrunk reproduction of the planted bug, as the example's test printed it.
    assert "state.compact(crash=Crash(" in out and "cause: the rename of kv.snapshot.tmp" in out
