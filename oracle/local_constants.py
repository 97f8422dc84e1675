"""The same Hypothesis inputs in every test process, whatever ran there before.

Hypothesis (since 6.131) sometimes draws a value from the constants it finds in
the source of the *local* modules loaded at that moment: modules outside the
standard library, site-packages and test directories. In the editable install
the README's quickstart makes, substrat, faultfs and oracle are local, and how
many of their modules a pytest process (an xdist worker) has imported by the
time of a draw depends on the tests it ran before, which xdist's scheduling
varies from run to run. So the ``ci`` profile (derandomized) and a fixed
``--hypothesis-seed`` drew different examples on the same commit, and a test
that finds a planted bug within a budget could pass in one order and not in
another (the faultfs example's key-value store did, after a test that imported
the orchestrator). Importing every module of the three packages before the
first test makes the pool the same in every process; it costs about half a
CPU second once per process.
"""

from __future__ import annotations

import importlib
import pkgutil

PACKAGES = ("substrat", "faultfs", "oracle")
"""The distribution's packages: local code to Hypothesis in an editable install."""


def import_project_modules() -> list[str]:
    """Import every module of :data:`PACKAGES`; return the ones that could not be imported.

    A module whose optional dependency is missing is skipped (its constants are
    then missing in every process of that environment alike). ``__main__``
    modules are not imported: importing one runs a program.
    """
    failed: list[str] = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}.", onerror=failed.append):
            if info.name.rpartition(".")[2] == "__main__":
                continue
            try:
                importlib.import_module(info.name)
            except ImportError:
                failed.append(info.name)
    return failed
