"""substrat's own test-suite configuration: the stress gate and the Hypothesis profiles.

They live in :mod:`oracle.pytest_plugin`, which installing the distribution
does not register (a project that installs substrat keeps its own ``stress``
marker, ``--run-stress`` and Hypothesis settings). This rootdir conftest loads
it at start-up, so ``--run-stress`` is known whichever tests are named on the
command line.
"""

from __future__ import annotations

import sys

# oracle.rewrite_scope first: it tells pytest not to rewrite Hypothesis, which
# oracle.pytest_plugin imports (pyproject.toml's addopts also load it, earlier,
# for the test tools' own plugins; a copy of this file, as the CI scripts' tests
# make, still gets it). An environment installed before the pytest11 entry
# point was dropped still loads oracle.pytest_plugin (as "substrat") ahead of
# this file; registering the module a second time would stop pytest.
# `pip install -e '.[dev]'` clears that up.
pytest_plugins = ["oracle.rewrite_scope"] + (
    [] if "oracle.pytest_plugin" in sys.modules else ["oracle.pytest_plugin"]
)
