"""Other file-system patchers: faultfs refuses to share the process with pyfakefs.

Both replace the file functions of os, io and builtins (and the names modules
bound to them). Stacked, each takes the other's replacements for the real
functions: pyfakefs's open reads its sources through faultfs's, which routes
back into pyfakefs (a RecursionError deep enough to end a pytest session), and
faultfs's simulated descriptors reach pyfakefs's table (EBADF '1073741824').
Neither error names the cause, so whichever starts second is refused.
"""

from __future__ import annotations

import sys
from typing import Any

from faultfs.errors import ConfigError

_PYFAKEFS = "pyfakefs.fake_filesystem_unittest"
WHY = (
    "faultfs and pyfakefs cannot be combined: both replace the file functions of os, io and "
    "builtins, so each would send the other's calls into itself. faultfs already keeps the "
    "files in memory; use one of them per test (drop pyfakefs's `fs` fixture or Patcher here, "
    "or run faultfs in a test without it)."
)


def _patcher_class() -> Any:
    """pyfakefs's Patcher if pyfakefs is loaded (its pytest plugin loads it); never imports it."""
    module = sys.modules.get(_PYFAKEFS)
    return getattr(module, "Patcher", None) if module is not None else None


def pyfakefs_active() -> bool:
    patcher = _patcher_class()
    if patcher is None:
        return False
    running = (getattr(patcher, "PATCHER", None), getattr(patcher, "DOC_PATCHER", None))
    return any(getattr(p, "_patching", False) for p in running if p is not None)


def refuse_if_patched() -> None:
    """Raise ConfigError when pyfakefs is patching (faultfs is about to start)."""
    if pyfakefs_active():
        raise ConfigError(f"faultfs cannot start while pyfakefs is active. {WHY}")


def _refused_setup(self: Any, *args: Any, **kwargs: Any) -> None:
    raise ConfigError(f"pyfakefs cannot start while faultfs is active. {WHY}")


def guard(saved: list[tuple[object, str, object]]) -> None:
    """While faultfs intercepts, refuse pyfakefs's start (restored with ``saved``).

    Refused in ``setUp`` before pyfakefs counts the patcher as started, so the
    pyfakefs tests after this one run normally.
    """
    patcher = _patcher_class()
    if patcher is None or not hasattr(patcher, "setUp"):
        return
    saved.append((patcher, "setUp", patcher.setUp))
    patcher.setUp = _refused_setup
