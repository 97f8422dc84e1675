"""The installed pytest plugins that a throw-away project's pytest runs do without.

pytest loads every installed ``pytest11`` plugin at each start. The workflow tests
run the CI scripts on fake projects and the mutant runner's tests run a probe
project: a dozen pytest starts whose tests use none of these four (pytest-benchmark,
pyfakefs, anyio's and faultfs's own), which cost about 0.6 of the 1.0 CPU s such a
start took here (0.3-0.4 without them; faultfs's modules are compiled from source at
each start where bytecode writing is off, as in this project's test environment).
The plugins the scripts do use stay: xdist (``-n``), pytest-timeout (``--timeout``),
Hypothesis.
"""

from __future__ import annotations

UNUSED_PLUGINS = ("benchmark", "fakefs", "anyio", "faultfs")
"""Their entry-point names (``-p no:NAME`` turns one off)."""

PYTEST_ARGS = tuple(arg for name in UNUSED_PLUGINS for arg in ("-p", f"no:{name}"))

PYTEST_INI = "[pytest]\naddopts = " + " ".join(PYTEST_ARGS) + "\n"
"""A fake project's ``pytest.ini``: every pytest run the scripts start there does without."""
