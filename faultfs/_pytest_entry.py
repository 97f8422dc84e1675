"""The ``pytest11`` entry point: faultfs's fixtures where faultfs can run, skips elsewhere.

Installing the distribution registers this module in every pytest run of the
project that installed it, so it must never break that run. On a POSIX
system it loads :mod:`faultfs.pytest_plugin`; on one without POSIX calls
(Windows: see :mod:`faultfs._platform`) it imports nothing else of faultfs and
gives the same marker and fixture names, which skip the tests that use them
with the reason: the project's other tests run as before.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Generator

import pytest

from faultfs._platform import unsupported_reason

_REASON = unsupported_reason()

_ORACLE_OPTIONS = ("--run-stress", "--fuzz-budget")
"""substrat's own options (:mod:`oracle.pytest_plugin`), which this entry point does not load."""


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> Generator[None, None, None]:
    """Say how to get ``--run-stress`` when nothing registered it, instead of argparse's
    bare "unrecognized arguments".

    Checked once the project's own conftest files are loaded, and without
    registering the option: a project's own ``--run-stress`` (or oracle's
    plugin, loaded with ``-p``) is parsed as ever, and nothing clashes with it.
    """
    yield
    if early_config.known_args_namespace.help:
        return
    _, unknown = parser.parse_known_and_unknown_args(args)
    wanted = [o for o in _ORACLE_OPTIONS if any(a == o or a.startswith(f"{o}=") for a in unknown)]
    if not wanted:
        return
    needs = ""
    if importlib.util.find_spec("hypothesis") is None:
        needs = ", which needs Hypothesis (pip install hypothesis)"
    raise pytest.UsageError(
        f"{' and '.join(wanted)}: substrat's own stress-test option, which installing substrat"
        " does not add to a project's tests (only faultfs's fixtures). Load substrat's plugin"
        f" with `-p oracle.pytest_plugin` on the command line or in addopts{needs}; it skips"
        " tests marked `stress` unless --run-stress is given. Or add your own option in your"
        " conftest.py."
    )


if _REASON is None:
    pytest_plugins = ["faultfs.pytest_plugin"]
else:

    def pytest_configure(config: pytest.Config) -> None:
        config.addinivalue_line("markers", f"faultfs: options for the faultfs fixtures ({_REASON})")

    @pytest.fixture
    def faultfs() -> None:
        pytest.skip(str(_REASON))

    @pytest.fixture
    def faultfs_explore() -> None:
        pytest.skip(str(_REASON))
