"""C code handed a simulated descriptor: numpy's file I/O, named for what it is.

numpy reads and writes a real file object from C: ``ndarray.tofile`` and
``numpy.fromfile``, and so ``numpy.save`` and ``numpy.load`` on a path or an open
file, call ``os.dup`` on its descriptor (intercepted: a new simulated descriptor)
and then C's ``fdopen`` on the result, which no kernel knows (they are numbered
from ``1 << 30``). fdopen fails, nothing reaches the real disk, and numpy raises an
OSError with no errno that blames the user's build ("If you built NumPy, you
probably linked with the wrong debug/release runtime"). :func:`diagnose
<faultfs._escapes.diagnose>` turns that error into an :class:`EscapeError` saying
why, and how to keep such I/O visible (through bytes and Python's file calls).
"""

from __future__ import annotations

from types import TracebackType

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
        f"{_where(exc.__traceback__)}numpy handed the descriptor of a file under the FaultFS "
        "root to C (ndarray.tofile, numpy.fromfile; numpy.save and numpy.load use them on a "
        "path or a real file object), and C's fdopen cannot open a simulated descriptor, so "
        f"numpy failed with {str(exc)!r}. {FIX}"
    )


def _where(tb: TracebackType | None) -> str:
    """'file:line (function): ' of the innermost frame outside numpy: the line that
    called numpy (``numpy.save`` goes into C from numpy's own Python code)."""
    found = None
    while tb is not None:
        if not str(tb.tb_frame.f_globals.get("__name__", "")).startswith("numpy"):
            found = tb
        tb = tb.tb_next
    if found is None:
        return ""
    code = found.tb_frame.f_code
    return f"{code.co_filename}:{found.tb_lineno} ({code.co_name}): "
