"""pytest plugin: rewrite the asserts of this project's tests, not of its test tools' packages.

pytest rewrites the ``assert`` statements of every module it imports from a
distribution that registers a ``pytest11`` plugin, the whole distribution, not
only the plugin module: here Hypothesis, anyio (brought in by the OpenAI SDK),
pyfakefs, pytest-benchmark, xdist and pytest-timeout, 140 modules. A rewritten
module is read from source, its syntax tree transformed and compiled, instead
of loaded from the bytecode its installer wrote; pytest keeps its own compiled
copy in ``__pycache__``, except when bytecode writing is off
(``PYTHONDONTWRITEBYTECODE``, as in this project's test environment), and then
every pytest process (each xdist worker, each pytest run a test starts) pays
it again: about 1.5-2 CPU s per process here (docs/benchmarks.md, issue 17's
sixth pass). Those packages' asserts are their own internal invariants; no
test of ours reads their messages.

pyproject.toml loads this module with ``-p oracle.rewrite_scope``: a ``-p``
plugin is imported after pytest installs its import hook and before the entry
point plugins, so the marks are dropped before those packages are imported.
The rootdir ``conftest.py`` names it too, ahead of :mod:`oracle.pytest_plugin`
(which imports Hypothesis), so a project that copies that file (the CI
scripts' tests do) gets it without the option. The test modules and
``conftest.py`` files are rewritten as before (pytest
picks them by file name, not by these marks), and so are modules named with
``pytest.register_assert_rewrite`` and ``-p`` plugins, pytester and this
distribution's own packages.

The marks are an attribute of pytest's import hook without a public setter
(``AssertionRewritingHook._must_rewrite``); if a pytest release renames it
this module changes nothing and the run only costs what it did before
(``tests/unit/test_rewrite_scope.py`` then fails and says so).
"""

from __future__ import annotations

import sys

UNREWRITTEN = frozenset(
    {
        "hypothesis",
        "_hypothesis_pytestplugin",
        "_hypothesis_globals",
        "_hypothesis_ftz_detector",
        "anyio",
        "pyfakefs",
        "pytest_benchmark",
        "xdist",
        "pytest_timeout",
    }
)
"""Top-level packages whose modules pytest is told not to rewrite: the test tools'."""


def _narrow() -> None:
    for finder in sys.meta_path:
        marks = getattr(finder, "_must_rewrite", None)
        cache = getattr(finder, "_marked_for_rewrite_cache", None)
        if not isinstance(marks, set) or not isinstance(cache, dict):
            continue
        marks.difference_update({name for name in marks if name.partition(".")[0] in UNREWRITTEN})
        cache.clear()


_narrow()
