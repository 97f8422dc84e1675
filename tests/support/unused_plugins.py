"""The installed pytest plugins that a throw-away project's pytest runs do without.

pytest loads every installed ``pytest11`` plugin at each start. The workflow tests
run the CI scripts on fake projects and the mutant runner's tests run a probe
project: a dozen pytest starts whose tests use none of these four (pytest-benchmark,
pyfakefs, anyio's and faultfs's own). Measured here, such a start took 1.0 CPU s with
them and 0.3-0.4 without when every process compiled from source (bytecode writing
off), and 0.40-0.45 against 0.24-0.25 with the session's shared bytecode cache
(tests/conftest.py).
The plugins the scripts do use stay: xdist (``-n``), pytest-timeout (``--timeout``),
Hypothesis.
"""

from __future__ import annotations

from oracle.pytest_plugin import PROJECT_IMPORTS

UNUSED_PLUGINS = ("benchmark", "fakefs", "anyio", "faultfs")
"""Their entry-point names (``-p no:NAME`` turns one off)."""

OTHER_PROJECTS_PLUGINS = ("benchmark", "fakefs", "anyio")
"""The ones that are not this project's: what a child pytest on a small test project
(tests/support/pytest_run.py) does without unless its tests use one. Measured at load 17
(taskset -c 1, 8 interleaved rounds, shared bytecode cache): a start with one test took
0.85 CPU s (0.73-1.01) with them and 0.60 (0.51-0.70) without."""


def turned_off(names: tuple[str, ...]) -> tuple[str, ...]:
    """pytest's arguments that turn the plugins ``names`` off."""
    return tuple(arg for name in names for arg in ("-p", f"no:{name}"))


# PROJECT_IMPORTS is oracle.pytest_plugin's import of every module of substrat, faultfs and
# oracle before the first test (oracle.local_constants): it evens out the pool of constants
# Hypothesis draws from across substrat's own test processes. The throw-away projects' tests
# assert nothing that depends on which examples are drawn (their bugs shrink to one minimal
# example whatever the pool), so their runs do without it: about half a CPU s in each child
# pytest process (and xdist worker) that runs tests there (docs/benchmarks.md, session 29).
PYTEST_ARGS = turned_off(UNUSED_PLUGINS) + turned_off((PROJECT_IMPORTS,))

PYTEST_INI = "[pytest]\naddopts = " + " ".join(PYTEST_ARGS) + "\n"
"""A fake project's ``pytest.ini``: every pytest run the scripts start there (and each of
their xdist workers) does without."""
