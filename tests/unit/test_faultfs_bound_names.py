"""Names bound to a patched function hold faultfs's version only while a FaultFS is active.

One rule for the os functions and the C stores' openers (sqlite3.connect,
mmap.mmap): a module-level or class-level name bound before the activation
(``from sqlite3 import connect`` at import) is pointed at faultfs's version for
the run, and a name that a module imported during the run bound to faultfs's
version holds the original again after the outermost exit. Each library is a
real module under a fresh name, as a user's is.
"""

from __future__ import annotations

import importlib
import itertools
import mmap
import os
import sqlite3
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import MethodType

import pytest

from faultfs import EscapeError, FaultFS

LIBRARY = """
import os
from mmap import mmap
from os import fsync
from sqlite3 import connect


class Store:
    _sync = os.fsync


def sync(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    fsync(fd)
    os.close(fd)
"""

_names = itertools.count()


@pytest.fixture
def lib_dir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "lib").mkdir()
    sys.path.insert(0, str(tmp_path / "lib"))
    try:
        yield tmp_path / "lib"
    finally:
        sys.path.remove(str(tmp_path / "lib"))


def write_library(lib_dir: Path) -> str:
    name = f"bound_lib_{next(_names)}"
    (lib_dir / f"{name}.py").write_text(textwrap.dedent(LIBRARY))
    importlib.invalidate_caches()
    return name


def test_connect_bound_before_activation_is_refused_like_sqlite3_connect(lib_dir: Path) -> None:
    lib = importlib.import_module(write_library(lib_dir))
    fs = FaultFS("/faultfs-bound-names-root")  # not on the real disk
    with pytest.raises(EscapeError, match=r"^sqlite3\.connect\('/faultfs-bound-names-root/a\.db'"):
        with fs:
            lib.connect(fs.path("a.db"))  # was sqlite3's bare "unable to open database file"
    assert len(fs.escapes) == 1
    assert lib.connect is sqlite3.connect  # the original again after the exit


def test_names_bound_during_a_run_hold_the_originals_after_it(lib_dir: Path) -> None:
    name = write_library(lib_dir)
    fs = FaultFS("/faultfs-bound-names-root")
    with fs:
        lib = importlib.import_module(name)  # binds the patched functions
        assert lib.connect is sqlite3.connect and hasattr(lib.connect, "__wrapped__")
    assert lib.connect is sqlite3.connect
    assert lib.fsync is os.fsync
    assert lib.mmap is mmap.mmap
    assert lib.Store.__dict__["_sync"] is os.fsync
    # ... and the next run points them at faultfs again, as for a module loaded before.
    again = FaultFS("/faultfs-bound-names-root")
    with again:
        lib.sync(again.path("f"))
        with pytest.raises(EscapeError):
            lib.connect(again.path("b.db"))
    assert [op.kind for op in again.trace].count("fsync") == 1
    assert lib.connect is sqlite3.connect and lib.fsync is os.fsync


def test_a_run_that_imports_nothing_leaves_other_names_alone(lib_dir: Path) -> None:
    lib = importlib.import_module(write_library(lib_dir))
    lib.mine = lib.fsync  # type: ignore[attr-defined]  # a name the user keeps: left alone
    with FaultFS("/faultfs-bound-names-root") as fs:
        lib.sync(fs.path("f"))
    assert lib.fsync is os.fsync and lib.mine is os.fsync
    assert [op.kind for op in fs.trace].count("fsync") == 1


BINDING_LIBRARY = """
import os


class Store:
    _sync = os.fsync  # a builtin: does not bind as a method
    _open = open

    def save(self, path):
        with self._open(path, "w") as f:
            f.write("x")
            f.flush()
            self._sync(f.fileno())
"""


def _write_binding_library(lib_dir: Path) -> str:
    """A fresh module of BINDING_LIBRARY in ``lib_dir``, not yet imported: its name."""
    name = f"bound_lib_{next(_names)}"
    (lib_dir / f"{name}.py").write_text(textwrap.dedent(BINDING_LIBRARY))
    importlib.invalidate_caches()
    return name


def test_a_class_made_during_a_run_calls_its_bound_builtins_as_builtins(lib_dir: Path) -> None:
    # Built-in functions do not bind as methods; faultfs's versions must not either, or
    # ``self._sync(fd)`` in a class a run imports passes ``self`` as the descriptor.
    name = _write_binding_library(lib_dir)
    fs = FaultFS("/faultfs-bound-names-root")
    with fs:
        lib = importlib.import_module(name)
        lib.Store().save(fs.path("f"))
    assert [op.kind for op in fs.trace].count("fsync") == 1
    lib.Store().save(str(lib_dir / "real"))  # after the run: the originals, on the real disk
    assert (lib_dir / "real").read_text() == "x"


def test_a_bound_builtin_on_a_class_calls_without_a_warning(lib_dir: Path) -> None:
    """faultfs's non-binding versions were functools.partial objects: Python 3.13 warns at
    each call through a class (FutureWarning: "functools.partial will be a method
    descriptor"), an error in a project run with -W error, and 3.14 binds them."""
    name = _write_binding_library(lib_dir)
    fs = FaultFS("/faultfs-bound-names-root")
    with fs:
        lib = importlib.import_module(name)
        store = lib.Store()
        held = type(store).__dict__["_sync"]
        assert getattr(held, "__get__", None) is None or not isinstance(
            held.__get__(store, type(store)), MethodType
        ), "a method: self._sync(fd) would pass self as the descriptor"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            store.save(fs.path("f"))
    assert [op.kind for op in fs.trace].count("fsync") == 1
