"""C code handed a simulated descriptor (numpy's file I/O), or reading a path itself
(polars, pyarrow), named for what it is.

numpy reads and writes a real file object from C: ``ndarray.tofile`` and
``numpy.fromfile``, and so ``numpy.save`` and ``numpy.load`` on a path or an open
file, call ``os.dup`` on its descriptor (intercepted: a new simulated descriptor)
and then C's ``fdopen`` on the result, which no kernel knows (they are numbered
from ``1 << 30``). fdopen fails, nothing reaches the real disk, and numpy raises an
OSError with no errno that blames the user's build ("If you built NumPy, you
probably linked with the wrong debug/release runtime"). :func:`diagnose
<faultfs._escapes.diagnose>` turns that error into an :class:`EscapeError` saying
why, and how to keep such I/O visible (through bytes and Python's file calls).

A library that opens a path from C or Rust (``polars.read_csv``, ``pyarrow.parquet
.read_table`` given a path) looks on the real disk, where the model's files are not:
it raises FileNotFoundError for a file the workload just wrote, which reads like a
crash lost it. :func:`unseen_read` names that: the path the error quotes is one the
model holds, so the read went around Python's os and io.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Protocol

from faultfs._trace import is_internal
from faultfs.errors import EscapeError

NUMPY_FDOPEN = "Getting a FILE* from a Python file object"
"""The start of numpy's error when fdopen of a dup'ed descriptor fails (every numpy
since 1.x; 2.x adds "via _fdopen failed. If you built NumPy, ...")."""

FIX = (
    "faultfs can neither see nor crash I/O done from C (docs/faultfs.md, 'Limits: what "
    "faultfs cannot see'). Keep the bytes in Python instead: save with "
    "`buf = io.BytesIO(); numpy.save(buf, a)` and write `buf.getvalue()` with open(); "
    "load with `numpy.load(io.BytesIO(f.read()))` (or `a.tobytes()` and "
    "`numpy.frombuffer(...)`)."
)


def numpy_handoff(exc: OSError) -> EscapeError | None:
    """The EscapeError for numpy's failed fdopen of a simulated descriptor, else None."""
    if exc.errno is not None or not str(exc).startswith(NUMPY_FDOPEN):
        return None
    return EscapeError(
        f"{_where(exc.__traceback__, _numpy)}numpy handed the descriptor of a file under the "
        "FaultFS root to C (ndarray.tofile, numpy.fromfile; numpy.save and numpy.load use "
        "them on a path or a real file object), and C's fdopen cannot open a simulated "
        "descriptor, so "
        f"numpy failed with {str(exc)!r}. {FIX}"
    )


def _where(tb: TracebackType | None, library: Callable[[TracebackType], bool]) -> str:
    """'file:line (function): ' of the innermost frame not in the ``library``: the line
    that called it (``numpy.save`` goes into C from numpy's own Python code)."""
    found = None
    while tb is not None:
        if not library(tb):
            found = tb
        tb = tb.tb_next
    if found is None:
        return ""
    code = found.tb_frame.f_code
    return f"{code.co_filename}:{found.tb_lineno} ({code.co_name}): "


def _numpy(tb: TracebackType) -> bool:
    return str(tb.tb_frame.f_globals.get("__name__", "")).startswith("numpy")


def _installed(tb: TracebackType) -> bool:
    """faultfs, the standard library or an installed package: not the user's own code."""
    name = tb.tb_frame.f_code.co_filename
    return is_internal(name) or "/site-packages/" in name


def unseen_read(exc: OSError, roots: Sequence[str]) -> EscapeError | None:
    """The EscapeError for a FileNotFoundError, raised by code that opened the path
    itself (C, Rust), naming a file under one of ``roots`` that the model holds; else None.

    Asked while the FaultFS is active (a fixture's test, explore's check), so the path
    is looked up in the model; asked after, it is looked up on the real disk, finds
    nothing, and the error stays as it was.
    """
    if not isinstance(exc, FileNotFoundError) or exc.filename is not None:
        return None  # Python's os sets filename: those calls reached the model
    text = str(exc)
    for root in roots:
        at = text.find(root + "/")
        if at < 0:
            continue
        # Where the quoted path ends: a quote, a space (or the end; a name may hold spaces).
        ends = [i for i, c in enumerate(text) if i > at and (c in "'\"`" or c.isspace())]
        for end in [*ends, len(text)]:
            path = text[at:end].rstrip(".,;:)")
            if os.path.lexists(path):
                where = _where(exc.__traceback__, _installed)
                return EscapeError(
                    f"{where}{path!r} is on the simulated disk, but "
                    f"the code that raised {type(exc).__name__}({text!r}) opened it on the real "
                    "disk, around Python's os and io (a library reading from C or Rust, as "
                    "polars and pyarrow do given a path), where the model's files are not. "
                    "faultfs can neither see nor crash that I/O (docs/faultfs.md, 'Limits: what "
                    "faultfs cannot see'). Open the file with open() and hand the library the "
                    "file object or its bytes: `polars.read_csv(io.BytesIO(f.read()))`."
                )
    return None


class _Disk(Protocol):
    """A FaultFS, as far as :func:`named_inside` uses it (faultfs._fs imports this module)."""

    crashed: bool

    @property
    def root(self) -> str: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any: ...


class named_inside:  # lower case: used as a function, `with named_inside(disk):`
    """``with disk:``, turning a hand-off to C or Rust into the EscapeError that names it.

    Only while ``disk`` is active can :func:`unseen_read` find the quoted path in the
    model: after ``with disk:`` it looks on the real disk, finds nothing, and the bare
    FileNotFoundError would read as a file the crash lost. Explore's workload and a
    state machine's setup, steps, recovery and check run inside this. A class, not a
    generator: pytest hides this frame, where contextlib's would be printed whole.
    """

    def __init__(self, disk: _Disk) -> None:
        self.disk = disk

    def __enter__(self) -> None:
        self.disk.__enter__()

    def __exit__(self, kind: Any, exc: BaseException | None, tb: TracebackType | None) -> None:
        __tracebackhide__ = True
        named = None
        if isinstance(exc, OSError) and not self.disk.crashed:  # a crashed disk refuses lookups
            named = numpy_handoff(exc) or unseen_read(exc, (self.disk.root,))
        if named is None:
            self.disk.__exit__(kind, exc, tb)
            return
        self.disk.__exit__(type(named), named, tb)  # what it raises itself comes first
        raise named from exc
