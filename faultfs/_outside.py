"""Calls on paths outside every active root: counted, refused if so configured.

faultfs's router (:mod:`faultfs._intercept`) hands such a call here. The test
framework's own I/O (pytest, Hypothesis) and the standard library's source readers
are never refused; a call that reads a root's real parent directories is let through
(the model has nothing above its root), and so is one on a kernel interface (/proc,
/sys, the devices under /dev), which holds nothing a crash could lose.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from types import FrameType
from typing import TYPE_CHECKING, Any

from faultfs._trace import is_internal
from faultfs.errors import OutsideRootError

if TYPE_CHECKING:
    from faultfs._fs import FaultFS

# Callers whose I/O outside the root is the test framework's, never refused or
# counted: the first frame outside faultfs and the standard library decides.
_FRAMEWORK = frozenset(
    {"_pytest", "pytest", "pluggy", "hypothesis", "_hypothesis_pytestplugin", "xdist",
     "execnet", "pytest_timeout", "pytest_benchmark", "coverage", "pytest_cov"}
)  # fmt: skip

_HELPERS = frozenset({"_pair", "_dir_target"})
_SOURCE_READERS = frozenset({"linecache", "tokenize", "traceback", "inspect", "warnings"})


def _caller(depth: int) -> tuple[bool, FrameType | None]:
    """(exempt, the first frame outside faultfs and the standard library).

    Exempt are the test framework's calls and the standard library's source
    readers (linecache for tracebacks and warnings): neither is code under test.
    """
    frame: FrameType | None = sys._getframe(depth + 1)
    while frame is not None and is_internal(frame.f_code.co_filename):
        if frame.f_globals.get("__name__") in _SOURCE_READERS:
            return True, frame
        frame = frame.f_back
    if frame is None:
        return False, None
    module = frame.f_globals.get("__name__") or ""
    return module.partition(".")[0] in _FRAMEWORK, frame


# Calls that change names: never let through on a root's parent directories.
_NAMESPACE_CHANGES = frozenset(
    {"mkdir", "rmdir", "unlink", "remove", "rename", "replace", "link", "symlink", "chmod",
     "utime", "truncate", "setxattr", "removexattr"}
)  # fmt: skip


def _above_a_root(stack: list[FaultFS], p: str) -> bool:
    prefix = p.rstrip("/") + "/"
    return any(fs.root.startswith(prefix) for fs in stack)


# Kernel interfaces, not storage: /proc and /sys are the kernel's view of the process
# and the machine (filelock stats /proc/self/ns/pid on every lock), and the devices
# under /dev (null, urandom, tty) keep nothing a crash could lose. Refusing them
# would only push users to outside="passthrough", which also lets real files go
# unchecked. /dev/shm and /dev/mqueue are memory file systems: files there are
# storage a program chose, so they stay refused.
_KERNEL = ("/proc/", "/sys/", "/dev/")
_KERNEL_STORAGE = ("/dev/shm/", "/dev/mqueue/")


def _kernel_interface(p: str) -> bool:
    slashed = p + "/"  # "/proc" itself too
    return slashed.startswith(_KERNEL) and not slashed.startswith(_KERNEL_STORAGE)


def outside(stack: list[FaultFS], given: Any, p: str, relative: bool) -> None:
    """A call on a path outside every active root (``stack``: the active ones, innermost
    last): count it, and refuse it if so configured. Called by the router, which is called
    by the intercepted function: the frames above it say which call it was and whose."""
    fs = stack[-1]
    if fs.outside == "passthrough" and not fs.watch_outside:
        return
    wrapper = sys._getframe(2)
    while wrapper.f_code.co_name in _HELPERS and wrapper.f_back is not None:
        wrapper = wrapper.f_back
    call = wrapper.f_code.co_name.lstrip("_").replace("builtin_", "")
    if call not in _NAMESPACE_CHANGES and _above_a_root(stack, p):
        # The model has nothing above its root; the real parents exist (stat("/"),
        # realpath's lstat of each parent, opening a parent to fsync it).
        return
    if call not in _NAMESPACE_CHANGES and _kernel_interface(p):
        return
    exempt, frame = _caller(3)
    if exempt:
        return
    site = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "<unknown>"
    where = f"relative path {given!r} (resolved against the real working directory to {p!r})"
    what = f"{call}({where if relative else repr(p)}) at {site}"
    fs.note_outside(what)
    if fs.outside == "refuse":
        fix = (
            f"use an absolute path under the root, e.g. fs.path({os.path.basename(p)!r})"
            if relative
            else "build the path from the root (fs.path(...))"
        )
        if _in_tempdir(p) and _called_by_tempfile():
            fix = (
                "give the code a temporary directory under the root: this is tempfile's "
                "default directory, on the real disk (pass the library its temp-dir argument, "
                "e.g. dir=fs.path('tmp'), or set tempfile.tempdir to a directory under the root "
                "for the test)"
            )
        raise OutsideRootError(
            f"{what}: outside the faultfs root {fs.root!r}, and outside='refuse'. To test this "
            f"I/O, {fix}; if the code must also use real files, pass outside='passthrough' "
            "(and suppress faultfs.HealthCheck.outside_root)."
        )


def _in_tempdir(p: str) -> bool:
    """Whether ``p`` is in tempfile's default directory (as far as tempfile already knows it:
    finding it writes probe files, which must not happen here)."""
    default = tempfile.tempdir
    return default is not None and os.path.dirname(p) == default.rstrip("/")


def _called_by_tempfile() -> bool:
    """Whether the tempfile module made the refused call (mkstemp, NamedTemporaryFile...):
    a name the code picked itself is only in the same directory."""
    frame: FrameType | None = sys._getframe(1)
    own = tempfile.__file__
    while frame is not None:
        if frame.f_code.co_filename == own:
            return True
        frame = frame.f_back
    return False


def prime_tempdir() -> None:
    """Let tempfile find its default directory now, on the real disk, before faultfs
    intercepts anything.

    Found inside a run under outside="refuse", its probe files are refused and
    tempfile says only "No usable temporary directory found"; known, a mkstemp
    in the run is refused with the fix above, which is what pytest runs (where
    it is known already) say.
    """
    if tempfile.tempdir is None:
        with contextlib.suppress(OSError):
            tempfile.gettempdir()
