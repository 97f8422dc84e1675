"""The fixed paths of a root, built once per process.

Opening a root builds a dozen :class:`~pathlib.Path` objects from the same few
names (the root, ``agents/``, ``quarantine/``, the user's log, the registry's,
the checkpoint store's, each session's directory, record and log), and each is
parsed and formatted again: about a tenth of an open of a small root, which the
crash fuzzers do thousands of times. A ``Path`` never changes, so one per
(root, names) is kept for every store of the process and shared (its text is
then formatted once, too).
"""

from __future__ import annotations

import os
from pathlib import Path, PosixPath, PurePosixPath

PATHS_KEPT = 1024
"""At most this many paths are kept (then all are dropped, and built again on demand)."""
_paths: dict[tuple[str, tuple[str, ...]], Path] = {}


_PLAIN_PATHS = frozenset({PosixPath, PurePosixPath})


def text(path: str | os.PathLike[str]) -> str:
    """``os.fspath(path)`` for a text path, without its two Python calls for a Path that
    formatted its text already (a Path kept here is asked for it at every step)."""
    if type(path) is str:
        return path
    if type(path) in _PLAIN_PATHS:
        kept = getattr(path, "_str", None)  # pathlib's own copy of its text, once formatted
        if type(kept) is str:
            return kept
    return os.fspath(path)


def under(root: str | os.PathLike[str], *names: str) -> Path:
    """``Path(root, *names)``, the same object for the same arguments."""
    key = (text(root), names)
    path = _paths.get(key)
    if path is None:
        if len(_paths) >= PATHS_KEPT:
            _paths.clear()
        path = _paths[key] = Path(key[0], *names)
    return path


def built(root: str, names: tuple[str, ...]) -> Path | None:
    """What :func:`under` gave for ``(root, *names)`` if it is still kept, else None (a
    caller that checks the names before building their path checks them only then)."""
    return _paths.get((root, names))
