"""A derandomized test draws the same inputs whatever the process imported before it.

Hypothesis mixes constants from the loaded local modules into its draws; the
project's plugin loads all of substrat, faultfs and oracle before the first test
(oracle.local_constants), so the tests that ran earlier on an xdist worker no
longer change which examples a derandomized profile makes.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

from tests.support.pytest_run import run_pytest

DRAWS = textwrap.dedent(
    """
    import json, os
    from hypothesis import given, settings, strategies as st

    def test_imports_first():
        if os.environ.get("IMPORT_FIRST"):
            import substrat.orchestrator, oracle.harness, faultfs.stateful  # noqa: F401

    SEEN = []

    @settings(max_examples=60, derandomize=True, database=None)
    @given(st.integers(0, 1 << 20), st.text(max_size=12))
    def test_draws(number, text):
        SEEN.append([number, text])

    def test_zz_write():
        with open(os.environ["DRAWS_OUT"], "w") as handle:
            json.dump(SEEN, handle)
    """
)


def draws(directory: Path, *, import_first: bool) -> list[list[object]]:
    out = directory / f"draws-{import_first}.json"
    env = {**os.environ, "DRAWS_OUT": str(out), "HYPOTHESIS_PROFILE": "default"}
    env.pop("IMPORT_FIRST", None)
    if import_first:
        env["IMPORT_FIRST"] = "1"
    plugins = ("-p", "oracle.pytest_plugin", "-p", "no:xdist", "-p", "no:randomly")
    run = run_pytest(directory, *plugins, "test_draws.py", env=env, safe_path=True)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text())


def test_earlier_imports_do_not_change_a_derandomized_tests_inputs(tmp_path: Path) -> None:
    directory = tmp_path / "tests"  # Hypothesis takes no constants from test directories
    directory.mkdir()
    (directory / "test_draws.py").write_text(DRAWS)
    plain = draws(directory, import_first=False)
    after_imports = draws(directory, import_first=True)
    assert len(plain) == 60
    assert plain == after_imports, "the inputs depend on what the process imported before"
