"""Stores that C code opens by path: named when they start under a FaultFS root.

LMDB, HDF5 (h5py given a file name) and gdbm/ndbm read and write their files
from C, not through Python's os and io, so the model never holds them. Under a
root that is not on the real disk they fail with their own ENOENT, and under a
real root they write the real disk unseen (found afterwards by
:mod:`faultfs._realdisk`). As sqlite3.connect is (:func:`faultfs._escapes.blind_spots`),
their open is refused with :class:`EscapeError` saying so, while a FaultFS is
active (patched at activation when their module is loaded, or as it finishes
loading during the run: :mod:`faultfs._late_imports`; no per-call cost).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from faultfs._escapes import bound_to, refuse_c_store, wrapper

if TYPE_CHECKING:
    from faultfs._fs import FaultFS

Owner = Callable[[str], "FaultFS | None"]

# module, attribute, what the message calls the library
_OPENERS = (
    ("lmdb", "open", "LMDB (lmdb.open)"),
    ("dbm.gnu", "open", "gdbm (dbm.gnu.open; dbm.open and shelve use it when it is available)"),
    ("dbm.ndbm", "open", "ndbm (dbm.ndbm.open; dbm.open and shelve use it when it is available)"),
)


def _path(value: Any) -> str | None:
    if isinstance(value, int) or not isinstance(value, str | bytes | os.PathLike):
        return None  # a descriptor or a Python file object: its I/O goes through Python
    text = os.fsdecode(os.fspath(value))
    if not text.startswith("/"):
        text = os.getcwd() + "/" + text
    return os.path.normpath(text)


def _refused(owner: Owner, library: str, value: Any) -> None:
    path = _path(value)
    refuse_c_store(owner, path, f"{library} on {path!r}", "a store", "it")


def _opener(real: Any, owner: Owner, library: str) -> Any:
    def opened(path: Any, *args: Any, **kwargs: Any) -> Any:
        _refused(owner, library, path)
        return real(path, *args, **kwargs)

    opened.__wrapped__ = real  # type: ignore[attr-defined]
    return opened


def blind_libraries(owner: Owner) -> list[tuple[Any, str, Any]]:
    """(namespace, name, replacement) for the loaded C stores that open files by path."""
    new: list[Any] = []
    for module_name, attribute, library in _OPENERS:
        module = sys.modules.get(module_name)
        real = getattr(module, attribute, None)
        if real is not None and not hasattr(real, "__wrapped__"):
            # One wrapper per opener, rebound wherever a name holds it (as sqlite3.connect).
            make = functools.partial(_opener, real, owner, library)
            if wrapper(real, make, f"{module_name}.{attribute}")[1]:
                new.append(real)
    patches = bound_to(new)
    h5_file = getattr(sys.modules.get("h5py"), "File", None)
    real_init = getattr(h5_file, "__init__", None) if isinstance(h5_file, type) else None
    if real_init is not None and not hasattr(real_init, "__wrapped__"):

        def init(self: Any, name: Any, *args: Any, **kwargs: Any) -> None:
            _refused(owner, "HDF5 (h5py.File given a file name)", name)
            real_init(self, name, *args, **kwargs)

        init.__wrapped__ = real_init  # type: ignore[attr-defined]
        patches.append((h5_file, "__init__", init))
    return patches
