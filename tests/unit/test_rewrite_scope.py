"""pytest rewrites this project's tests, not the test tools' packages (oracle.rewrite_scope)."""

from __future__ import annotations

import sys

import hypothesis.core
import pytest
from _pytest.assertion.rewrite import AssertionRewritingHook

from oracle.rewrite_scope import UNREWRITTEN


def rewritten(module_name: str) -> bool:
    return isinstance(getattr(sys.modules[module_name], "__loader__", None), AssertionRewritingHook)


def test_the_test_tools_packages_are_loaded_as_installed(pytestconfig: pytest.Config) -> None:
    if pytestconfig.getoption("assertmode") != "rewrite":
        pytest.skip("assertion rewriting is off in this run (--assert=plain)")
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
