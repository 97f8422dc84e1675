"""pytest rewrites this project's tests, not the test tools' packages (oracle.rewrite_scope)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import hypothesis.core
import pytest
from _pytest.assertion.rewrite import AssertionRewritingHook

from oracle.rewrite_scope import UNREWRITTEN
from tests.support.pytest_run import run_pytest

REPO = Path(__file__).resolve().parents[2]


def rewritten(module_name: str) -> bool:
    return isinstance(getattr(sys.modules[module_name], "__loader__", None), AssertionRewritingHook)


def test_the_test_tools_packages_are_loaded_as_installed(pytestconfig: pytest.Config) -> None:
    if pytestconfig.getoption("assertmode") != "rewrite":
        pytest.skip("assertion rewriting is off in this run (--assert=plain)")
    hooks = [f for f in sys.meta_path if isinstance(f, AssertionRewritingHook)]
    if hooks and not all(isinstance(getattr(f, "_must_rewrite", None), set) for f in hooks):
        # A newer pytest without the attribute: the run is slower, never wrong, so this
        # says so instead of failing every fresh install until the module catches up.
        pytest.skip(
            f"pytest {pytest.__version__}'s import hook has no _must_rewrite set: "
            "oracle.rewrite_scope cannot narrow the rewriting; update it for this pytest"
        )
    loaded = [
        name for name in sys.modules if name.partition(".")[0] in UNREWRITTEN and rewritten(name)
    ]
    assert hypothesis.core.__name__ in sys.modules
    assert loaded == [], f"pytest rewrote the test tools' modules {loaded[:5]}"


def test_a_test_modules_asserts_still_explain_themselves(pytestconfig: pytest.Config) -> None:
    if pytestconfig.getoption("assertmode") != "rewrite":
        pytest.skip("assertion rewriting is off in this run (--assert=plain)")
    assert rewritten(__name__)
    seen = {"examples": 200}
    with pytest.raises(AssertionError) as failed:
        assert seen["examples"] == 50
    assert "200 == 50" in str(failed.value)


PROBE = """
import sys

import hypothesis.core
from _pytest.assertion.rewrite import AssertionRewritingHook


def test_probe():
    loader = sys.modules["hypothesis.core"].__loader__
    print("hypothesis.core rewritten:", isinstance(loader, AssertionRewritingHook))
"""


def test_a_copy_of_the_rootdir_conftest_scopes_the_rewriting_without_the_option(
    tmp_path: Path,
) -> None:
    """The CI scripts' tests run pytest in projects with a copy of conftest.py, not our
    pyproject.toml: the conftest names the plugin ahead of the one that imports Hypothesis."""
    shutil.copy2(REPO / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = run_pytest(tmp_path, "-s", "test_probe.py", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hypothesis.core rewritten: False" in result.stdout, result.stdout
