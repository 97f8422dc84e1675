"""No silent pass through the real disk: what goes around faultfs's model is named.

Each test uses a real directory as the root and the real thing that goes
around the model: a file opened before activation, C code writing through
libc (ctypes, as a C extension does), a forked or exec'd child, a FIFO. Each
checks that the run stops with an error saying what happened, instead of
passing while the real disk changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from faultfs import EscapeError, FaultFS, UnsupportedOperation, explore
from faultfs.stateful import CrashStateMachine, rule

LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def c_write(path: str, data: bytes) -> None:
    """Create ``path`` and write ``data`` from C (libc's open and write), as a C extension does."""
    fd = LIBC.open(path.encode(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    LIBC.write(fd, data, len(data))
    LIBC.close(fd)


def save(fs: FaultFS, version: int) -> None:
    with open(fs.path("state.json"), "w") as handle:
        json.dump({"v": version}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    fs.ack(version)


def check(img: FaultFS) -> None:
    if os.path.exists(img.path("state.json")):
        with open(img.path("state.json")) as handle:
            json.load(handle)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "data"
    path.mkdir()
    yield str(path)


# ------------------------------------------------- descriptors opened before activation


def test_a_file_opened_before_activation_and_written_inside_is_named(root: str) -> None:
    handle = open(os.path.join(root, "audit.log"), "a")
    raw = os.open(os.path.join(root, "raw.log"), os.O_WRONLY | os.O_CREAT, 0o644)
    fs = FaultFS(root)
    try:
        with fs:  # opened before, not written: nothing to say
            save(fs, 1)
        with pytest.raises(EscapeError, match=rf"audit\.log \(descriptor {handle.fileno()}\)"):
            with fs:
                handle.write("saved\n")
                handle.flush()
        with pytest.raises(EscapeError, match=rf"raw\.log \(descriptor {raw}\).*the workload"):
            with fs:
                os.write(raw, b"x")
        assert len(fs.escapes) == 2
    finally:
        handle.close()
        os.close(raw)


def test_explore_stops_on_a_log_handler_set_up_before_it(root: str) -> None:
    # The usual app: its audit log handler is opened at import, its data directory fixed.
    audit = logging.getLogger("s16d.audit")
    handler = logging.FileHandler(os.path.join(root, "audit.log"))
    audit.addHandler(handler)
    audit.propagate = False

    def workload(fs: FaultFS) -> None:
        save(fs, 1)
        audit.warning("saved 1")

    try:
        with pytest.raises(EscapeError, match=r"audit\.log \(descriptor \d+\) was opened"):
            explore(workload, check, root=root)
    finally:
        audit.removeHandler(handler)
        handler.close()


# ------------------------------------------- C code and other processes on the real disk


def test_explore_fails_when_c_code_writes_the_real_root(root: str) -> None:
    def workload(fs: FaultFS) -> None:
        save(fs, 1)
        c_write(fs.path("store.db"), b"from C")

    with pytest.raises(EscapeError, match=r"store\.db appeared on the real disk under the FaultFS"):
        explore(workload, check, root=root)


def test_explore_names_a_changed_real_file_under_the_root(root: str) -> None:
    Path(root, "store.db").write_bytes(b"old")

    def workload(fs: FaultFS) -> None:
        save(fs, 1)
        c_write(os.path.join(fs.root, "store.db"), b"more")

    with pytest.raises(EscapeError, match=r"store\.db changed on the real disk"):
        explore(workload, check, root=root)


def test_a_file_c_code_created_and_removed_under_the_root_is_noticed(root: str) -> None:
    def workload(fs: FaultFS) -> None:
        save(fs, 1)
        c_write(fs.path("journal"), b"x")
        assert LIBC.unlink(fs.path("journal").encode()) == 0

    with pytest.raises(EscapeError, match=r"the root directory itself \(an entry was created"):
        explore(workload, check, root=root)


class CStoreMachine(CrashStateMachine):
    """A store whose data file is written from C: the machine cannot see or crash it."""

    profiles = ("posix",)

    def recover(self) -> None:
        self.path = self.fs.path("c.db")

    @rule()
    def put(self) -> None:
        with self.acknowledging("x"):
            c_write(self.path, b"x")

    def check(self) -> None:
        pass


def test_the_state_machine_fails_when_c_code_writes_its_real_root(root: str) -> None:
    machine = type("RealRootMachine", (CStoreMachine,), {"root": root})
    with pytest.raises(EscapeError, match=r"c\.db (appeared|changed) on the real disk"):
        run_state_machine_as_test(machine, settings=settings(max_examples=5, deadline=None))


def test_fork_is_refused_while_active(root: str) -> None:
    fs = FaultFS(root)
    with fs:
        with pytest.raises(EscapeError, match=r"os\.fork\(\) while the FaultFS .* own copy"):
            pid = os.fork()
            if pid == 0:  # without the refusal: the child leaves at once
                os._exit(0)
            os.waitpid(pid, 0)
        process = multiprocessing.get_context("fork").Process(target=print)
        with pytest.raises(EscapeError, match=r"os\.fork\(\)"):
            process.start()
            process.join()
    assert len(fs.escapes) == 2


def test_a_check_that_runs_recovery_in_a_child_process_is_refused(tmp_path: Path) -> None:
    fsck = "import os, sys; assert os.path.isdir(sys.argv[1])"

    def workload(fs: FaultFS) -> None:
        save(fs, 1)

    def check_in_a_child(img: FaultFS) -> None:
        assert os.path.isdir(img.root)
        subprocess.run([sys.executable, "-c", fsck, img.root], check=True)

    with pytest.raises(EscapeError, match=r"subprocess\.Popen: its arguments name .*real file sys"):
        explore(workload, check_in_a_child, root=str(tmp_path / "missing"))


def test_a_child_process_not_told_the_root_still_runs(root: str) -> None:
    fs = FaultFS(root)
    with fs:
        done = subprocess.run([sys.executable, "-c", "print('hi')"], capture_output=True)
    assert done.stdout == b"hi\n" and not fs.escapes


def test_fifos_and_device_nodes_are_refused_under_the_root(root: str, tmp_path: Path) -> None:
    fs = FaultFS(root)
    with fs:
        with pytest.raises(UnsupportedOperation, match="does not model FIFOs"):
            os.mkfifo(fs.path("fifo"))
        with pytest.raises(UnsupportedOperation, match="does not model device nodes"):
            os.mknod(fs.path("node"))
        os.mkfifo(tmp_path / "outside")  # outside the root: the real call
    assert os.listdir(root) == [] and (tmp_path / "outside").exists()


# ------------------------------------------------ C stores opened by path: named at once


def test_lmdb_and_h5py_opened_under_a_root_are_named() -> None:
    lmdb = pytest.importorskip("lmdb")
    h5py = pytest.importorskip("h5py")
    fs = FaultFS("/faultfs-s16d")  # not on the real disk: lmdb's own error would be ENOENT
    with fs:
        with pytest.raises(EscapeError, match=r"LMDB \(lmdb\.open\) on '/faultfs-s16d/db'"):
            lmdb.open(fs.path("db"))
        with pytest.raises(EscapeError, match=r"HDF5 \(h5py\.File given a file name\)"):
            h5py.File(fs.path("d.h5"), "w")
    assert len(fs.escapes) == 2


def test_gdbm_opened_under_a_root_is_named() -> None:
    gnu = pytest.importorskip("dbm.gnu")  # absent from Pythons built without gdbm
    fs = FaultFS("/faultfs-s16d")
    with fs:
        with pytest.raises(EscapeError, match=r"gdbm \(dbm\.gnu\.open"):
            gnu.open(fs.path("g"), "c")


def test_a_shell_directory_under_the_root_does_not_refuse_children(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PWD and OLDPWD are the shell's: a test run started inside the root's real directory
    # refused every child process, told the root or not.
    monkeypatch.setenv("PWD", root)
    monkeypatch.setenv("OLDPWD", os.path.join(root, "sub"))
    fs = FaultFS(root)
    with fs:
        done = subprocess.run([sys.executable, "-c", "print('hi')"], capture_output=True)
        assert done.stdout == b"hi\n" and not fs.escapes
        monkeypatch.setenv("DATA_DIR", root)  # set by the code: the child is told the root
        with pytest.raises(EscapeError, match="its environment name"):
            subprocess.run([sys.executable, "-c", "print('hi')"], capture_output=True)
