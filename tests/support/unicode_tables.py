"""Hypothesis's Unicode tables for a child test run in a throw-away directory.

The first ``st.text()`` draw of a process builds Hypothesis's tables of Unicode
categories and of the characters UTF-8 encodes (about 1.5 CPU s at load 11, Python
3.11), unless it finds them in its storage directory (``.hypothesis/unicode_data``
under the directory it starts in). A child pytest run in a scratch project starts with
none, so each one that draws text built them again, though the run's own storage had
them already (docs/benchmarks.md, "What the main job spends outside its items").

The tables are a pure function of the Python's ``unicodedata`` version, which names their
directory, so a copy is exactly what the child would build. Only that directory is
copied: the child's example database and constants cache stay its own.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

UNICODE_DATA = "unicode_data"


def own_unicode_data() -> Path | None:
    """This process's ``unicode_data`` directory in Hypothesis's storage, if it has one."""
    try:
        from hypothesis.configuration import storage_directory

        where = Path(storage_directory(UNICODE_DATA, intent_to_write=False).path)
    except (ImportError, TypeError, AttributeError):  # another Hypothesis: children build theirs
        return None
    return where if where.is_dir() else None


def give_unicode_tables(project: Path) -> bool:
    """Copy this process's Unicode tables into ``project``'s ``.hypothesis``; whether it did.

    Nothing happens when this process has none yet, or when ``project`` has its own.
    """
    ours = own_unicode_data()
    theirs = project / ".hypothesis" / UNICODE_DATA
    if ours is None or theirs.exists() or ours.resolve() == theirs.resolve():
        return False
    with contextlib.suppress(FileExistsError):
        shutil.copytree(ours, theirs)  # Hypothesis renames each table in whole: none is cut
    return True
