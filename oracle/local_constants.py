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

Installed from a wheel (another project's tests, with ``-p oracle.pytest_plugin``),
the packages live in site-packages, which Hypothesis never counts as local: their
constants are in no draw, the pool is the same whatever was imported, and importing
them all would only cost the process about a CPU second (200 modules, review s27d).
So only the packages Hypothesis takes for local are imported (:func:`local_packages`).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

PACKAGES = ("substrat", "faultfs", "oracle")
"""The distribution's packages: local code to Hypothesis in an editable install."""


def local_packages() -> list[str]:
    """The packages of :data:`PACKAGES` whose modules Hypothesis reads constants from.

    Asked of Hypothesis itself (the rule is its own: not the standard library, not
    site-packages, not a test directory). A Hypothesis without that function (one
    before 6.131 has no such pool; a later one may move it) gets all three, as before.
    """
    try:
        from hypothesis.internal.constants_ast import is_local_module_file
    except ImportError:
        return list(PACKAGES)
    local = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        try:
            seen = origin is None or is_local_module_file(origin)
        except Exception:  # another signature in another Hypothesis: import, as before
            seen = True
        if seen:
            local.append(name)
    return local


def import_project_modules() -> list[str]:
    """Import every module of the :func:`local_packages`; return those that failed to import.

    A module whose optional dependency is missing is skipped (its constants are
    then missing in every process of that environment alike). ``__main__``
    modules are not imported: importing one runs a program.
    """
    failed: list[str] = []
    for name in local_packages():
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}.", onerror=failed.append):
            if info.name.rpartition(".")[2] == "__main__":
                continue
            try:
                importlib.import_module(info.name)
            except ImportError:
                failed.append(info.name)
    return failed
