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

UNUSED_PLUGINS = ("benchmark", "fakefs", "anyio", "faultfs")
"""Their entry-point names (``-p no:NAME`` turns one off)."""

PYTEST_ARGS = tuple(arg for name in UNUSED_PLUGINS for arg in ("-p", f"no:{name}"))

PYTEST_INI = "[pytest]\naddopts = " + " ".join(PYTEST_ARGS) + "\n"
"""A fake project's ``pytest.ini``: every pytest run the scripts start there does without."""
