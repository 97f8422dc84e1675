"""What makes a directory a substrat root by itself, for the code that must tell a root
inside another (a *nested* root) from its own files: the marker's name, the root a path
lies inside (:func:`enclosing_root`), and whether a directory found inside a root is one
(:func:`root_within`); and where no root can be (:func:`kernel_place`).

Kept apart from :mod:`substrat.rootdir`, which imports the storage modules' names, so
that the session store can ask it without an import circle.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from substrat.rpc import lock

MARKER_NAME = "substrat-root.json"


def enclosing_root(path: Path) -> Path | None:
    """The substrat root ``path`` lies inside (its nearest ancestor that is one), or None.

    The path is resolved first (symlinks, ``..``): a root reached through a link is still
    inside the other. An ancestor is a root when it holds the marker, or a lock file with a
    daemon's record (a root from before the marker). A stat or two per ancestor.
    """
    for parent in Path(os.path.realpath(path)).parents:
        if os.path.lexists(parent / MARKER_NAME):
            return parent
        if os.path.lexists(parent / lock.LOCK_NAME):
            try:
                info = lock.read_info(parent)
            except OSError:
                info = None
            if info is not None and info.state in ("running", "stopped"):
                return parent
    return None


def root_within(path: Path) -> str | None:
    """Why the directory ``path``, found inside a root, is a substrat root of its own (a
    nested root, made by an older version inside another's directories), or None.

    Such a directory is never moved, quarantined or deleted by the outer root's fsck or
    start (its daemon may be running in it): they report it and leave it. A symlink is
    not followed (moving one moves only the link).
    """
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
        names = os.listdir(path)
    except OSError:
        return None
    if MARKER_NAME in names:
        return f"it holds {MARKER_NAME}"
    if lock.LOCK_NAME in names:
        try:
            if lock.is_held(path):
                return f"a live process holds its {lock.LOCK_NAME}"
            info = lock.read_info(path)
        except OSError:
            return None
        if info is not None and info.state in ("running", "stopped"):
            return f"its {lock.LOCK_NAME} names a daemon"
    return None


NESTED_ROOT_ADVICE = "move it out by hand (`mv` it elsewhere); substrat leaves it where it is"


# Kernel file systems: what they show is made up by the kernel on each read, and they
# hold no files of anyone's (mkdir fails there with ENOENT, fsync with EINVAL).
_KERNEL_PLACES = (
    ("/proc", "procfs, the kernel's view of its processes"),
    ("/sys", "sysfs, the kernel's view of its devices and settings"),
)


def kernel_place(path: Path) -> str | None:
    """Why ``path`` (resolved) cannot hold a root, when it is on a kernel file system."""
    real = os.path.realpath(path)
    for top, what in _KERNEL_PLACES:
        if real == top or real.startswith(top + "/"):
            return (
                f"it is under {top} ({what}), which holds no files and keeps nothing; use "
                "--root or SUBSTRAT_HOME to pick a directory on a disk"
            )
    return None
