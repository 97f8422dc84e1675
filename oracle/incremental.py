"""Incremental observation: re-derive what a check reads from disk only where the disk changed.

A state machine checks the running orchestrator after every step, and the
costly part of that check is re-reading each agent's conversation from its
log. A step changes the logs of one agent or a few; :class:`FilesMemo` keeps
what was derived from each agent's log (or any file or directory) together
with the bytes it was derived from, and derives it again only when those bytes
differ. The key is the content, not a counter, so the memo is exactly as
strong as deriving every time, provided the derivation reads nothing else; every
``verify_every``-th lookup derives anyway and fails loudly if the memo was
stale (that is, if the derivation came to depend on other files).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from faultfs import FaultFS

T = TypeVar("T")
Extend = Callable[[T, dict[str, Any], dict[str, Any]], T | None]
"""(value derived from the files of then, the files then, the files now) -> the value of
now, or None (see :meth:`FilesMemo.get`)."""
VERIFY_EVERY = 16
"""One lookup in this many derives again and compares (0: never)."""


def files_below(fs: FaultFS | None, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Relative path -> bytes (None for a directory) below ``path``; {} if it is absent.

    A file maps "" to its bytes; a path that cannot be read (a file where a
    directory is expected on the way) maps "" to the error's errno. On a FaultFS
    the model is read directly (no interception); with ``fs`` None the real
    disk is read.
    """
    if fs is not None:
        text = os.fspath(path)
        try:  # a directory first: the checks ask for log directories after every step
            return fs.read_tree(text)
        except NotADirectoryError:
            pass  # a file, or a file where a directory is expected on the way
        try:
            return {"": fs.read_file(text)}
        except FileNotFoundError:
            return {}
        except OSError as exc:
            return {"": exc.errno}
    top = Path(path)
    out: dict[str, Any] = {}
    if top.is_file():
        return {"": top.read_bytes()}
    if not top.is_dir():
        return out
    for folder, dirs, files in os.walk(top):
        base = Path(folder).relative_to(top)
        for name in dirs:
            out[str(base / name)] = None
        for name in files:
            out[str(base / name)] = (Path(folder) / name).read_bytes()
    return out


def log_files(log_path: str | os.PathLike[str]) -> str:
    """What to key a value derived from an event log on: the log's directory.

    A log is its active file and the sealed segments beside it (and reading it
    consults the checkpoints there); keyed on the active file alone, a memo
    answered from old bytes after a crash changed only a segment. (Text, not a
    Path: the checks ask it for every agent after every step.)
    """
    return os.path.dirname(os.fspath(log_path))


LOG_PREFIX = "events."
NOT_READ_WITH_THE_LOG = frozenset({"events.pending"})
"""A log's files that reading it never reads: the pending copy of the last append
(only an open that repairs the log reads it)."""


def log_part(files: dict[str, Any]) -> dict[str, Any]:
    """What reading a log reads of its directory's files (:func:`files_below` of
    :func:`log_files`): the active file, the sealed segments, the start record and
    the base; not the session record beside them, nor the pending copy.

    Both change on steps that leave the log as it was (a session suspended, an
    append's pending copy), and a memo keyed on them derived again for nothing.
    The memo's periodic re-derivation still catches a reader that comes to read
    another file. Kept whatever its name: an entry for the directory itself ("",
    when it is a file or cannot be read).
    """
    return {
        name: data
        for name, data in files.items()
        if name == "" or (name.startswith(LOG_PREFIX) and name not in NOT_READ_WITH_THE_LOG)
    }


class StaleMemo(AssertionError):
    """A memoised value differs from a fresh derivation: the derivation reads other files."""


class FilesMemo(Generic[T]):
    """Values derived from a file (or the files below a directory), re-derived when they change."""

    def __init__(self, verify_every: int = VERIFY_EVERY) -> None:
        assert verify_every >= 0
        self.verify_every = verify_every
        self._memo: dict[str, tuple[dict[str, Any], T]] = {}
        self.lookups = 0
        self.derived = 0
        self.extended = 0

    def get(
        self,
        fs: FaultFS | None,
        path: str | os.PathLike[str],
        derive: Callable[[], T],
        files: dict[str, Any] | None = None,
        extend: Extend[T] | None = None,
    ) -> T:
        """``derive()``, or the value it gave when the files at ``path`` held the same bytes.

        ``files``: what :func:`files_below` gives for ``path`` now (a caller that
        looks at one file for several memos reads it once), or the part of it the
        derivation reads (e.g. the session records below a directory that holds
        logs too); the periodic re-derivation still catches a derivation that
        reads more than that. ``extend``: when the files changed, ``extend(value,
        files then, files now)`` may give what ``derive()`` would from the value of
        then (None: it cannot, derive); every ``verify_every``-th such value is
        derived again and compared.
        """
        key = os.fspath(path)
        if files is None:
            files = files_below(fs, key)
        self.lookups += 1
        held = self._memo.get(key)
        if held is not None and held[0] == files:
            if self.verify_every and self.lookups % self.verify_every == 0:
                fresh = derive()
                if fresh != held[1]:
                    raise StaleMemo(
                        f"the value derived from {key} changed while its files did not: "
                        "the derivation reads files outside that directory, so this memo "
                        "must not be used for it"
                    )
            return held[1]
        value = None if held is None or extend is None else extend(held[1], held[0], files)
        if value is None:
            value = derive()
            self.derived += 1
        else:
            self.extended += 1
            if self.verify_every and self.extended % self.verify_every == 0 and derive() != value:
                raise StaleMemo(
                    f"the value extended from what {key} held before differs from a fresh "
                    "derivation of its files: the extension is wrong"
                )
        self._memo[key] = (files, value)
        return value

    def forget(self) -> None:
        self._memo.clear()
