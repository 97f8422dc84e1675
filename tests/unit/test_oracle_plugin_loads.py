"""What `-p oracle.pytest_plugin` loads in another project that installed substrat (review s27d).

Before its first test, the plugin imported every module of substrat, faultfs and oracle
(oracle.local_constants), so that Hypothesis, which draws some values from the constants
of *local* modules, sees the same pool in every process of an editable checkout. In a
project that installed the wheel those modules are in site-packages, which Hypothesis
never reads constants from: the 200 imports bought nothing and cost about 0.9 CPU s per
pytest process (1.84 to 0.97 s for one trivial test, s28b). Now only packages Hypothesis
takes for local are imported.

The child runs on copies of the three packages under a ``site-packages`` directory (links
to this checkout's, first on its path), as pip would install them. What the interpreter
itself loads (a ``.pth`` hook, the image's preinstalled packages) is not ours and is not
asserted on: only substrat's, faultfs's and oracle's modules are.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

from oracle.local_constants import PACKAGES, local_packages
from oracle.pytest_plugin import PROJECT_IMPORTS
from tests.support.pytest_run import run_pytest

REPORT = """
import json, os, sys

def test_report():
    mine = {"substrat", "faultfs", "oracle"}
    ours = sorted(m for m in sys.modules if m.partition(".")[0] in mine)
    with open(os.environ["LOADED_OUT"], "w") as handle:
        json.dump({"ours": ours, "oracle": sys.modules["oracle"].__file__}, handle)
"""

PLUGIN_ITSELF = {
    "oracle",
    "oracle.corpus",
    "oracle.fuzz_budget",
    "oracle.local_constants",
    "oracle.pytest_plugin",
}
"""What the plugin needs: its profiles' example database, the fuzz budget option."""


def packages_under(directory: Path) -> Path:
    """Links to substrat, faultfs and oracle in ``directory``; returns it."""
    directory.mkdir(parents=True)
    for name in PACKAGES:
        source = importlib.import_module(name).__file__
        assert source is not None
        (directory / name).symlink_to(Path(source).parent, target_is_directory=True)
    return directory


def loaded(project: Path, packages: Path) -> tuple[set[str], str]:
    out = project / "loaded.json"
    env = {**os.environ, "LOADED_OUT": str(out), "PYTHONPATH": str(packages)}
    env.pop("HYPOTHESIS_PROFILE", None)
    run = run_pytest(
        project, "-p", "oracle.pytest_plugin", "test_report.py", env=env, safe_path=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    return set(report["ours"]), report["oracle"]


def test_an_installed_copy_loads_no_substrat_and_only_the_plugin_of_oracle(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_report.py").write_text(REPORT)
    site = packages_under(tmp_path / "venv" / "lib" / "python3" / "site-packages")
    ours, oracle_file = loaded(project, site)
    assert oracle_file == str(site / "oracle" / "__init__.py")  # the copy, not the checkout
    assert not {m for m in ours if m.partition(".")[0] == "substrat"}
    assert {m for m in ours if m.partition(".")[0] == "oracle"} == PLUGIN_ITSELF
    # faultfs: its fixtures' plugin, which installing the distribution registers.
    assert "faultfs.pytest_plugin" in ours


def test_a_local_checkout_still_imports_every_module_first() -> None:
    # This checkout is local to Hypothesis: the pool must not depend on the tests run before.
    assert local_packages() == list(PACKAGES)


def test_a_run_can_turn_the_import_of_every_module_off(tmp_path: Path) -> None:
    # The throw-away projects of the CI scripts' tests run with it off (PYTEST_ARGS), to
    # save each of their child processes that half CPU second; this checkout is local, so
    # without the switch the plugin would import all of substrat before test_report.
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_report.py").write_text(REPORT)
    out = project / "loaded.json"
    env = {**os.environ, "LOADED_OUT": str(out)}
    env.pop("HYPOTHESIS_PROFILE", None)
    run = run_pytest(
        project,
        "-p",
        "oracle.pytest_plugin",
        "-p",
        f"no:{PROJECT_IMPORTS}",
        "test_report.py",
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    ours = json.loads(out.read_text())["ours"]
    assert not {m for m in ours if m.partition(".")[0] == "substrat"}, ours
    assert {m for m in ours if m.partition(".")[0] == "oracle"} == PLUGIN_ITSELF
