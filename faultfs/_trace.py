"""Operation records and the call site that issued them (outside faultfs and the stdlib)."""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import NamedTuple

_FAULTFS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB_DIRS = tuple(
    {
        os.path.abspath(sysconfig.get_paths()[key]) + os.sep
        for key in ("stdlib", "platstdlib")
        if sysconfig.get_paths().get(key)
    }
)
# Frames from these files are skipped: the interesting line is the caller's,
# not shutil's or pathlib's. Site-packages sit under the stdlib directory on
# some installs, so they are explicitly kept.
_internal_cache: dict[str, bool] = {}


def _is_internal(filename: str) -> bool:
    known = _internal_cache.get(filename)
    if known is not None:
        return known
    internal = filename.startswith(_FAULTFS_DIR)
    if not internal and "-packages" not in filename:
        internal = filename.startswith(_STDLIB_DIRS) or filename.startswith("<frozen")
    _internal_cache[filename] = internal
    return internal


def call_site(depth: int = 2) -> str:
    """``file:line`` of the innermost frame outside faultfs and the standard library."""
    frame = sys._getframe(depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_internal(filename):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>"


class Op(NamedTuple):
    """One mutating operation: what, on which path, with which arguments, from where."""

    kind: str
    path: str
    args: tuple[object, ...]
    site: str

    def __str__(self) -> str:
        args = " ".join(str(a) for a in self.args)
        sep = " " if args else ""
        return f"{self.kind} {self.path}{sep}{args} @ {self.site}"
