"""One Hypothesis constants cache for the throw-away projects of a test process.

Hypothesis (6.131 on) draws some values from the constants in the source of the local
modules a process has loaded; in an editable install that is every module of substrat,
faultfs and oracle, which the project's stress plugin imports before a process's first
test (oracle/local_constants.py). The first draw of a process parses each such module
unless ``.hypothesis/constants`` holds a file for its source (named by the source's
hash), and a throw-away project (tests/support/ci_project.py) starts with none: each
child pytest there that draws parsed all ~200 modules again, about 1 CPU s of a child's
2.7 (docs/benchmarks.md, "Child pytest runs and python -c children").

So every such project of one test process links its ``.hypothesis/constants`` to one
directory of that process: the first child that draws fills it, the later ones read it.
A file holds what the parse gives for that exact source, so a child draws the same
examples either way (checked with 50 derandomized examples of integers, text, floats
and bytes: identical). The examples database and everything else in a project's
``.hypothesis`` stay its own. One directory per test process, not one per run: the
children of one xdist worker run one after another, so two children never write one
file at once (Hypothesis 6.155 writes these files in place, not atomically).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

CONSTANTS = "constants"

_shared: Path | None = None


def shared_constants_dir() -> Path:
    """This process's constants directory, made at the first call, removed at exit."""
    global _shared
    if _shared is None:
        _shared = Path(tempfile.mkdtemp(prefix="substrat-hypothesis-constants-"))
        atexit.register(shutil.rmtree, _shared, ignore_errors=True)
    return _shared


def share_constants(project: Path, shared: Path | None = None) -> Path:
    """Link ``project``'s ``.hypothesis/constants`` to ``shared`` (by default this process's).

    Returns the link. ``project`` must not have its own constants directory yet.
    """
    link = project / ".hypothesis" / CONSTANTS
    link.parent.mkdir(parents=True, exist_ok=True)
    target = shared if shared is not None else shared_constants_dir()
    link.symlink_to(target, target_is_directory=True)
    return link
