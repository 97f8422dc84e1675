"""C stores imported while a FaultFS is active: patched as they finish loading.

sqlite3, mmap and the C stores of :mod:`faultfs._cext` are patched at activation
only when they are already loaded (a patch per call would cost every call). A
program that imports one inside ``with fs:`` would otherwise reach the real disk
unseen (or fail with the library's own bare error under a simulated root). While
a FaultFS is active, a finder at the front of ``sys.meta_path`` sees the import
of these few modules (an import not in ``sys.modules`` yet; nothing else asks it,
and no I/O call does), lets the usual finder load the module and then has it
patched as at activation. The patches are undone at the outermost exit with the
others.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

# The modules whose loading is watched: the top-level names the patches read.
WATCHED = frozenset(("sqlite3", "mmap", "lmdb", "dbm.gnu", "dbm.ndbm", "h5py"))


class _PatchAfterLoading(Loader):
    """The real loader, then the patches (and the module's loader is the real one again)."""

    def __init__(self, real: Loader, loaded: Callable[[], None]) -> None:
        self.real = real
        self.loaded = loaded

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            self.real.exec_module(module)
        finally:
            module.__loader__ = self.real
            if module.__spec__ is not None:
                module.__spec__.loader = self.real
        self.loaded()


class _Watch(MetaPathFinder):
    def __init__(self, loaded: Callable[[], None]) -> None:
        self.loaded = loaded

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in WATCHED:
            return None
        for finder in sys.meta_path:
            find: Any = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchAfterLoading(spec.loader, self.loaded)
                return spec
        return None


_installed: list[_Watch] = []


def install(loaded: Callable[[], None]) -> None:
    """Watch the imports of WATCHED until :func:`uninstall`; ``loaded()`` patches them."""
    if not _installed:
        watch = _Watch(loaded)
        _installed.append(watch)
        sys.meta_path.insert(0, watch)


def uninstall() -> None:
    while _installed:
        watch = _installed.pop()
        if watch in sys.meta_path:
            sys.meta_path.remove(watch)
