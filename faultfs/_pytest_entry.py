"""The ``pytest11`` entry point: faultfs's fixtures where faultfs can run, skips elsewhere.

Installing the distribution registers this module in every pytest run of the
project that installed it, so it must never break that run. On a POSIX
system it loads :mod:`faultfs.pytest_plugin`; on one without POSIX calls
(Windows: see :mod:`faultfs._platform`) it imports nothing else of faultfs and
gives the same marker and fixture names, which skip the tests that use them
with the reason: the project's other tests run as before.
"""

from __future__ import annotations

import pytest

from faultfs._platform import unsupported_reason

_REASON = unsupported_reason()

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
