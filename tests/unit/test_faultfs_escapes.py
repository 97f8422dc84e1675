"""No escapes: every way Python code reaches the file system hits the model or stops loudly.

Each test runs against a real directory as the FaultFS root, holding real
files (and a real ``.tmp`` file a stray rename would move), and checks that the
directory is byte for byte what it was. The library under test is a real
module imported before the FaultFS is activated, as a user's library is.
"""

from __future__ import annotations

import gc
import importlib
import io
import itertools
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from faultfs import (
    EscapeError,
    FaultFS,
    HealthCheck,
    OutsideRootError,
    SimulatedCrash,
    explore,
)

LIBRARY = '''
import os
from os import fsync, replace

_fsync = os.fsync
_replace = os.replace
LOG = []


def save(path, data):
    """An atomic save written with names bound at import time."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, data)
    fsync(fd)
    _fsync(fd)
    os.close(fd)
    replace(tmp, path)
    dfd = os.open(os.path.dirname(path), os.O_RDONLY)
    Store._sync(dfd)
    os.close(dfd)


def save_plain(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    replace(tmp, path)


def save_again(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    _replace(path + ".tmp", path)


class Store:
    _sync = os.fsync  # a class attribute, bound at import

    def __init__(self):
        self.fsync = os.fsync  # instance attributes: nothing can rebind them
        self.replace = os.replace

    def put(self, path, data):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, data)
        self.fsync(fd)
        os.close(fd)

    def move(self, src, dst):
        self.replace(src, dst)


class Journal:
    """Writes its closing record from a finalizer, as some libraries do."""

    def __init__(self, path):
        self.path = path
        self.me = self  # a reference cycle: only the garbage collector frees it

    def __del__(self):
        with open(self.path + ".closed", "w") as f:
            f.write("closed")
        os.replace(self.path + ".closed", self.path + ".done")
'''

_names = itertools.count()


@pytest.fixture
def lib(tmp_path: Path) -> Iterator[ModuleType]:
    """The library above, imported (before any FaultFS is active) under a fresh name."""
    name = f"escape_lib_{next(_names)}"
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / f"{name}.py").write_text(textwrap.dedent(LIBRARY))
    sys.path.insert(0, str(tmp_path / "lib"))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path / "lib"))
        sys.modules.pop(name, None)


@pytest.fixture
def real_root(tmp_path: Path) -> Path:
    """A real directory used as the root, with files a stray real call would change."""
    root = tmp_path / "real"
    (root / "sub").mkdir(parents=True)
    (root / "data.json").write_bytes(b'{"real": true}')
    (root / "data.json.tmp").write_bytes(b"a real temp file a real rename would move")
    (root / "sub" / "keep").write_bytes(b"keep")
    return root


def tree(path: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every entry under ``path``: mode and bytes (None for directories)."""
    out: dict[str, tuple[int, bytes | None]] = {}
    for entry in sorted(path.rglob("*")):
        st = entry.lstat()
        data = None if entry.is_dir() else entry.read_bytes()
        out[str(entry.relative_to(path))] = (st.st_mode, data)
    return out


def untouched(path: Path, before: dict[str, tuple[int, bytes | None]]) -> None:
    assert tree(path) == before, "the real directory changed"


def check_saved(img: FaultFS) -> None:
    assert img.tree().get("data.json", b"new") == b"new"


# ------------------------------------------------------- import-bound fsync


def test_import_bound_fsync_hits_the_model(lib: ModuleType, real_root: Path) -> None:
    before = tree(real_root)
    with FaultFS(real_root, outside="refuse") as fs:
        lib.save(fs.path("data.json"), b"new")
    kinds = [op.kind for op in fs.trace]
    # `from os import fsync`, `_fsync = os.fsync` and the class attribute: three fsyncs
    assert kinds.count("fsync") == 3, fs.trace
    assert fs.read_file("data.json") == b"new"
    assert fs.tree(durable=True)["data.json"] == b"new"
    report = explore(
        lambda f: lib.save(f.path("data.json"), b"new"),
        check_saved,
        root=str(real_root),
        suppress_health_check=[HealthCheck.nothing_acknowledged],  # it checks where I/O went
    )
    assert report.ok and report.boundaries == 12
    untouched(real_root, before)
    assert lib.fsync is os.fsync and lib._fsync is os.fsync  # restored after deactivation


def test_an_fsync_bound_where_nothing_can_rebind_it_stops_explore_by_name(
    lib: ModuleType, real_root: Path
) -> None:
    before = tree(real_root)
    store = lib.Store()  # made before activation: self.fsync is the real os.fsync
    with pytest.raises(EscapeError) as info:
        explore(lambda f: store.put(f.path("log"), b"x"), check_saved, root=str(real_root))
    message = str(info.value)
    assert f"{lib.__name__}:Store.put" in message
    assert "os.fsync through `self.fsync`" in message
    assert "look the function up when calling it" in message
    untouched(real_root, before)


# ------------------------------------------------------ import-bound replace


def test_import_bound_replace_hits_the_model(lib: ModuleType, real_root: Path) -> None:
    before = tree(real_root)
    with FaultFS(real_root, outside="refuse") as fs:
        lib.save_plain(fs.path("data.json"), b"new")  # `from os import replace`
        lib.save_again(fs.path("other"), b"again")  # `_replace = os.replace`
    renames = [op for op in fs.trace if op.kind == "rename"]
    assert [op.path for op in renames] == [fs.path("data.json.tmp"), fs.path("other.tmp")]
    assert fs.tree()["data.json"] == b"new" and fs.tree()["other"] == b"again"
    report = explore(
        lambda f: lib.save_plain(f.path("data.json"), b"new"),
        check_saved,
        root=str(real_root),
        suppress_health_check=[HealthCheck.nothing_acknowledged],  # it checks where I/O went
    )
    assert report.ok
    untouched(real_root, before)


def test_a_replace_bound_where_nothing_can_rebind_it_is_stopped_by_name(
    lib: ModuleType, real_root: Path
) -> None:
    before = tree(real_root)
    store = lib.Store()

    def workload(fs: FaultFS) -> None:
        with open(fs.path("data.json.tmp"), "wb") as f:
            f.write(b"new")
        store.move(fs.path("data.json.tmp"), fs.path("data.json"))

    with pytest.raises(EscapeError) as info:
        explore(workload, check_saved, root=str(real_root))
    message = str(info.value)
    assert f"{lib.__name__}:Store.move" in message
    assert "os.replace through `self.replace`" in message
    assert repr(str(real_root / "data.json.tmp")) in message
    untouched(real_root, before)


def test_under_a_simulated_root_an_escaped_replace_is_named(lib: ModuleType) -> None:
    store = lib.Store()

    def workload(fs: FaultFS) -> None:
        with open(fs.path("a"), "wb") as f:
            f.write(b"x")
        store.move(fs.path("a"), fs.path("b"))  # the real os.replace: ENOENT on the real disk

    with pytest.raises(EscapeError) as info:
        explore(workload, check_saved)
    message = str(info.value)
    assert "os.replace through `self.replace`" in message
    # Named from the ENOENT it met, or stopped before by the audit hook an
    # earlier real-directory root installed in this process.
    assert "'/faultfs-explore/a' reached the real file system" in message or (
        "the real os.rename call on '/faultfs-explore/a'" in message
    )


def test_a_swallowed_escape_still_stops_explore(lib: ModuleType, real_root: Path) -> None:
    before = tree(real_root)
    store = lib.Store()

    def workload(fs: FaultFS) -> None:
        with open(fs.path("a"), "w") as f:
            f.write("a")
        try:
            store.move(fs.path("a"), fs.path("b"))
        except Exception:  # a library that shrugs off a failed rename
            pass

    with pytest.raises(EscapeError, match=r"Store\.move"):
        explore(workload, check_saved, root=str(real_root))
    untouched(real_root, before)


# ------------------------------------------------------------- relative paths


def test_a_relative_path_is_refused_and_names_the_fix(
    real_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    before, before_cwd = tree(real_root), tree(cwd)

    def workload(fs: FaultFS) -> None:
        with open("data.json", "w") as f:  # meant fs.path("data.json")
            f.write("new")

    with pytest.raises(OutsideRootError) as info:
        explore(workload, check_saved, root=str(real_root))
    message = str(info.value)
    assert "'data.json'" in message and "relative" in message
    assert "fs.path(" in message
    untouched(real_root, before)
    untouched(cwd, before_cwd)


def test_a_relative_path_inside_the_root_hits_the_model(
    real_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(real_root)
    before = tree(real_root)
    with FaultFS(real_root, outside="refuse") as fs:
        os.mkdir("sub")
        with open("data.json", "w") as f:
            f.write("new")
        os.replace("data.json", "sub/moved")
    assert fs.tree() == {"sub": None, "sub/moved": b"new"}
    untouched(real_root, before)


# ------------------------------------------------------ finalizers after a crash


@pytest.fixture
def unraisable(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What the interpreter reports as 'Exception ignored in ...' while the test runs."""
    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    return seen


def journal_workload(lib: ModuleType) -> Callable[[FaultFS], None]:
    def workload(fs: FaultFS) -> None:
        journal = lib.Journal(fs.path("journal"))
        with open(fs.path("journal"), "w") as f:
            f.write("entry")
        dfd = os.open(fs.root, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        fs.ack("entry")
        del journal  # in a cycle: it outlives this line until a collection

    return workload


def test_a_crashed_runs_finalizers_never_reach_the_real_disk(
    lib: ModuleType, real_root: Path, unraisable: list[Any]
) -> None:
    before = tree(real_root)
    workload = journal_workload(lib)
    for boundary in range(1, 7):
        fs = FaultFS(real_root, outside="refuse")
        fs.arm(boundary)
        with pytest.raises(SimulatedCrash), fs:
            workload(fs)
        assert ".done" not in "".join(fs.tree())  # the dead process wrote nothing more
    report = explore(workload, lambda img: img.tree(), root=str(real_root))
    assert report.boundaries > 0
    gc.collect()  # whatever is left is finalized now, after every FaultFS is gone
    untouched(real_root, before)
    assert unraisable == []


def test_finalizers_under_a_virtual_root_print_nothing(
    lib: ModuleType, unraisable: list[Any]
) -> None:
    report = explore(journal_workload(lib), lambda img: img.tree())
    assert report.boundaries > 0
    gc.collect()
    assert unraisable == []


def test_a_finished_runs_finalizers_run_inside_the_model(
    lib: ModuleType, real_root: Path, unraisable: list[Any]
) -> None:
    before = tree(real_root)
    with FaultFS(real_root, outside="refuse") as fs:
        journal_workload(lib)(fs)
    gc.collect()
    assert fs.tree()["journal.done"] == b"closed"  # collected before deactivation
    untouched(real_root, before)
    assert unraisable == []


# ------------------------------------------------------------------ the default


def test_explore_refuses_paths_outside_the_root_by_default(tmp_path: Path) -> None:
    def workload(fs: FaultFS) -> None:
        with open(fs.path("f"), "w") as f:
            f.write("x")
        with open(tmp_path / "real-log", "w") as f:
            f.write("log")

    with pytest.raises(OutsideRootError, match="real-log"):
        explore(workload, lambda img: img.tree())
    assert not (tmp_path / "real-log").exists()


_EARLY_FILEIO = io.FileIO  # bound at import: faultfs intercepts io.FileIO looked up at the call


def test_io_fileio_bound_before_activation_is_stopped(real_root: Path) -> None:
    before = tree(real_root)
    with FaultFS(real_root, outside="refuse") as fs, pytest.raises(EscapeError) as info:
        _EARLY_FILEIO(fs.path("data.json"), "w")
    assert "`from io import FileIO`, for instance" in str(info.value)
    assert fs.escapes == [str(info.value)]
    untouched(real_root, before)


def test_reading_the_roots_parents_is_neither_refused_nor_counted(real_root: Path) -> None:
    with FaultFS(real_root / "data", outside="refuse") as fs:
        os.makedirs(fs.path("a", "b"))
        assert os.path.realpath(fs.path("a", "b")) == fs.path("a", "b")  # lstat of each parent
        assert os.stat("/").st_ino == os.lstat("/").st_ino
        fd = os.open(real_root, os.O_RDONLY)  # a parent opened to fsync it
        os.fsync(fd)
        os.close(fd)
        with pytest.raises(OutsideRootError):
            os.rename(real_root / "sub", real_root / "moved")  # changing names there is not
    assert fs.outside_calls == 1


def test_the_scan_does_not_wake_a_lazy_proxy(real_root: Path) -> None:
    """A module attribute that loads something when asked for its ``__class__`` (the
    OpenAI SDK's lazy module proxies do) is left asleep by activation's scan, and an
    fsync bound in the same module is still found."""
    woken: list[str] = []

    class LazyProxy:
        @property  # type: ignore[misc]
        def __class__(self) -> type:
            woken.append("__class__")
            return ModuleType

    name = f"proxy_holder_{next(_names)}"
    module = ModuleType(name)
    module.proxy = LazyProxy()  # type: ignore[attr-defined]
    module.fsync = os.fsync  # type: ignore[attr-defined]
    sys.modules[name] = module
    try:
        with FaultFS(real_root, outside="refuse") as fs:
            fd = os.open(fs.path("new.json"), os.O_WRONLY | os.O_CREAT, 0o644)
            module.fsync(fd)  # type: ignore[attr-defined]
            os.close(fd)
        assert woken == []
        assert [op.kind for op in fs.trace].count("fsync") == 1, fs.trace
    finally:
        sys.modules.pop(name, None)
