"""What makes a directory a substrat root by itself, for the code that must tell a root
inside another (a *nested* root) from its own files: the marker's name, the root a path
lies inside (:func:`enclosing_root`), and whether a directory found inside a root is one
(:func:`root_within`); and where no root can be (:func:`kernel_place`, :func:`dangling`,
:func:`settled`).

Kept apart from :mod:`substrat.rootdir`, which imports the storage modules' names, so
that the session store can ask it without an import circle.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from substrat.errors import RootUnusableError
from substrat.rpc import lock
from substrat.shellword import shell_word, shown

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


def settled(path: Path) -> Path:
    """The absolute ``path`` with its ``..`` resolved as the kernel resolves them: the part
    up to the last ``..`` by its real path, the rest as written (a root named by a symlink
    stays so named). Lexically, ``sub/link/../x`` would name a directory the kernel does not
    (``link``'s target's parent holds ``x``), and a root made by ``mkdir -p`` of it would be
    made elsewhere than it is then used; ``nope/../x`` names nothing at all. Raises
    RootUnusableError (one line, nothing created) when that part cannot be looked up."""
    parts = path.parts
    if ".." not in parts:
        return path
    last = len(parts) - parts[::-1].index("..")
    head = Path(*parts[:last])
    try:
        os.stat(head)  # the kernel's walk: every step exists and is a directory
    except OSError as exc:
        raise RootUnusableError(
            f"cannot use {shown(path)} as a substrat root: the path up to its last `..` "
            f"({shown(head)}) cannot be followed ({exc.strerror}); give a path whose "
            "directories all exist"
        ) from None
    return Path(os.path.realpath(head), *parts[last:])


def user_name(uid: int) -> str:
    """`` (name)`` of a uid, for a message; empty if it has none."""
    try:
        import pwd

        return f" ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return ""


def dangling(path: Path) -> RootUnusableError | None:
    """Why no root can be made at ``path`` when it, or the nearest of its ancestors that is
    there, is a symlink to nothing (None when not): say so, and where it points. Under such
    a link, creating the root failed with a bare "File exists", and a command that only
    reads suggested the `daemon start` that then failed so."""
    link = next((p for p in (path, *path.parents) if os.path.lexists(p)), path)
    if not os.path.islink(link) or os.path.exists(link):
        return None
    target = os.readlink(link)
    what = "it is" if link == path else f"{shown(link)} is"
    made_by = os.lstat(link).st_uid
    if made_by != os.getuid():  # maybe planted: never suggest making its target
        return RootUnusableError(
            f"cannot use {shown(path)} as a substrat root: {what} a symlink to "
            f"{shown(target)}, which does not exist, made by uid {made_by}{user_name(made_by)}, "
            "not by you; use --root or SUBSTRAT_HOME to pick a directory of your own"
        )
    return RootUnusableError(
        f"cannot use {shown(path)} as a substrat root: {what} a symlink to {shown(target)}, "
        f"which does not exist; make that directory (`mkdir -m 700 {shell_word(target)}`), or "
        "remove the link, or use --root or SUBSTRAT_HOME to pick another directory"
    )
