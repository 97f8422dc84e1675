"""faultfs runs on POSIX systems only; elsewhere importing it says so, once, plainly.

faultfs models POSIX file semantics (fsync, rename over a name, directory
entries made durable by an fsync of the directory) and intercepts the ``os``
module's POSIX calls, some through ``fcntl``. On a system without them (Windows)
the first import would fail deep inside with ``No module named 'fcntl'``;
the package imports nothing else there, and taking any name from it raises
:class:`ImportError` with the reason instead. The pytest plugin then registers
fixtures that skip saying why, so a project that installs this distribution on
such a system keeps a working test run (see :mod:`faultfs.pytest_plugin`).
"""

from __future__ import annotations

import os

UNSUPPORTED = (
    "faultfs needs a POSIX system (it is built and tested on Linux): it models POSIX "
    "file semantics (fsync, rename, durable directory entries) and intercepts the os module's "
    "POSIX "
    "calls, which {system} does not have (no module {missing!r}); run crash tests on "
    "Linux, e.g. in WSL or a Linux CI runner"
)


def missing_posix_module() -> str | None:
    """The POSIX-only module this Python lacks (None: it has them all)."""
    try:
        import fcntl  # noqa: F401  (what faultfs's interception imports anyway)
        import posix  # noqa: F401
    except ImportError as exc:
        return exc.name or "fcntl"
    return None


def unsupported_reason() -> str | None:
    """Why faultfs cannot run here, or None when it can."""
    missing = missing_posix_module()
    if missing is None:
        return None
    return UNSUPPORTED.format(system=f"this system ({os.name})", missing=missing)
