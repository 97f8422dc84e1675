"""substrat's own test-suite configuration: the stress gate and the Hypothesis profiles.

They live in :mod:`oracle.pytest_plugin`, which installing the distribution
does not register (a project that installs substrat keeps its own ``stress``
marker, ``--run-stress`` and Hypothesis settings). This rootdir conftest loads
it at start-up, so ``--run-stress`` is known whichever tests are named on the
command line.
"""

from __future__ import annotations

import sys

# An environment installed before the pytest11 entry point was dropped still
# loads the plugin (as "substrat") ahead of this file; registering the module
# a second time would stop pytest. `pip install -e '.[dev]'` clears that up.
pytest_plugins = [] if "oracle.pytest_plugin" in sys.modules else ["oracle.pytest_plugin"]
