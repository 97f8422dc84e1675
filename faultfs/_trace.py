"""Operation records and the frames that issued them.

Every recorded operation keeps a short stack: the frames from the first one
outside faultfs (standard library included, so an ``os.link`` issued by
``shutil`` is seen there) outward, up to the next faultfs frame (explore or a
state machine calling the workload) or ``MAX_STACK_FRAMES``. ``Op.site`` is
the first of them in the user's code: outside faultfs and the standard library
(installed packages count as the user's code: they are what is under test).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from typing import NamedTuple

_FAULTFS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB_DIRS = tuple(
    {
        os.path.abspath(sysconfig.get_paths()[key]) + os.sep
        for key in ("stdlib", "platstdlib")
        if sysconfig.get_paths().get(key)
    }
)
# Frames kept per operation: the first outside faultfs, the user's, and
# callers enough to tell two callers of one helper apart.
MAX_STACK_FRAMES = 4
_new_tuple = tuple.__new__

# The frames that submitted the work a pool's thread runs (set by faultfs._threads).
WORKER = threading.local()
WORKER_FILE = "<worker thread>"
"""The file of the frame marking where a worker's own frames end and its submitter's begin."""

_kind_cache: dict[str, int] = {}
_FAULTFS, _STDLIB, _USER = 0, 1, 2


def _kind(filename: str) -> int:
    known = _kind_cache.get(filename)
    if known is not None:
        return known
    if filename.startswith(_FAULTFS_DIR):
        kind = _FAULTFS
    elif "-packages" in filename:
        # Site-packages sit under the stdlib directory on some installs: an
        # installed library is code under test, not the standard library.
        kind = _USER
    elif filename.startswith(_STDLIB_DIRS) or filename.startswith(("<frozen", WORKER_FILE)):
        kind = _STDLIB
    else:
        kind = _USER
    _kind_cache[filename] = kind
    return kind


def is_user_file(filename: str) -> bool:
    """Whether ``filename`` is the user's code (not faultfs, not the standard library)."""
    return _kind(filename) == _USER


def in_faultfs(filename: str) -> bool:
    """Whether ``filename`` is one of faultfs's own modules."""
    return _kind(filename) == _FAULTFS


def is_internal(filename: str) -> bool:
    """Whether frames of ``filename`` belong to faultfs or the standard library."""
    return _kind(filename) != _USER


class Frame(NamedTuple):
    """One frame of the code that issued an operation."""

    file: str
    line: int
    function: str

    @property
    def in_stdlib(self) -> bool:
        return _kind(self.file) == _STDLIB

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def display(self, relative_to: str | None = None) -> str:
        """``file:line``, shortened: relative to ``relative_to``, or ``<stdlib>/name``."""
        return f"{display_path(self.file, relative_to)}:{self.line}"


def display_path(filename: str, relative_to: str | None = None) -> str:
    """A source path as a report shows it."""
    if relative_to and filename.startswith(relative_to.rstrip(os.sep) + os.sep):
        return filename[len(relative_to.rstrip(os.sep)) + 1 :]
    for prefix in _STDLIB_DIRS:
        if filename.startswith(prefix) and "-packages" not in filename:
            return "<stdlib>/" + filename[len(prefix) :]
    marker = filename.rfind("-packages" + os.sep)
    if marker >= 0:
        return "<site-packages>/" + filename[marker + len("-packages" + os.sep) :]
    return filename


def call_stack(depth: int = 2) -> tuple[tuple[Frame, ...], str]:
    """The issuing frames (first outside faultfs to the next faultfs frame), and the user site.

    This runs for every recorded operation, so it reads the kind cache inline
    and builds Frames without the NamedTuple constructor's Python call.
    """
    cache = _kind_cache
    frame = sys._getframe(depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        kind = cache.get(filename)
        if (kind if kind is not None else _kind(filename)) != _FAULTFS:
            break
        frame = frame.f_back  # type: ignore[assignment]
    out: list[Frame] = []
    site = ""
    while frame is not None and len(out) < MAX_STACK_FRAMES:
        code = frame.f_code
        filename = code.co_filename
        kind = cache.get(filename)
        if kind is None:
            kind = _kind(filename)
        if kind == _FAULTFS:
            break
        line = frame.f_lineno
        out.append(_new_tuple(Frame, (filename, line, code.co_name)))
        if not site and kind == _USER:
            site = f"{filename}:{line}"
        frame = frame.f_back  # type: ignore[assignment]
    if out and not site:
        # Deep in the standard library: still name the user's line that led there.
        while frame is not None and _kind(frame.f_code.co_filename) != _USER:
            frame = frame.f_back  # type: ignore[assignment]
        if frame is not None:
            code = frame.f_code
            out.append(_new_tuple(Frame, (code.co_filename, frame.f_lineno, code.co_name)))
            site = f"{code.co_filename}:{frame.f_lineno}"
        elif threading.current_thread() is not threading.main_thread():
            # A pool ran a built-in directly: name who submitted the work.
            submitted = getattr(WORKER, "frames", None) or ()
            out = [out[0], _new_tuple(Frame, (WORKER_FILE, 0, "worker")), *submitted]
            site = user_site(submitted) if submitted else ""
    return tuple(out), site or (str(out[0]) if out else "<unknown>")


def user_site(stack: tuple[Frame, ...]) -> str:
    """``file:line`` of the first frame of ``stack`` in the user's code."""
    for frame in stack:
        if _kind(frame.file) == _USER:
            return f"{frame.file}:{frame.line}"
    return str(stack[0]) if stack else "<unknown>"


def call_site(depth: int = 2) -> str:
    """``file:line`` of the innermost frame outside faultfs and the standard library."""
    return call_stack(depth + 1)[1]


class Op(NamedTuple):
    """One mutating operation: what, on which path, with which arguments, from where.

    ``site`` is the first frame in the user's code; ``stack`` every recorded
    frame from the first one outside faultfs (which may be the standard
    library's); ``seq`` the model's clock after the operation (it matches
    operations to the unsynced changes they left).
    """

    kind: str
    path: str
    args: tuple[object, ...]
    site: str
    stack: tuple[Frame, ...] = ()
    seq: int = 0

    def __str__(self) -> str:
        args = " ".join(str(a) for a in self.args)
        sep = " " if args else ""
        return f"{self.kind} {self.path}{sep}{args} @ {self.site}"
