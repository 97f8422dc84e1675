"""A plain FaultFS on a real root stops what goes around Python's os and io, as the docs say.

Two ways: a C store imported while the FaultFS is active is patched as it
finishes loading (its open is refused with EscapeError, as when it was loaded
before), and any other write under the root on the real disk (C code, another
process) is found when the FaultFS exits. The import runs in a fresh
interpreter: the test process may have loaded sqlite3 already.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from faultfs import EscapeError, FaultFS

LATE_SQLITE = """
import os, sys
from faultfs import EscapeError, FaultFS
assert "sqlite3" not in sys.modules
root = sys.argv[1]
fs = FaultFS(root)
try:
    with fs:
        import sqlite3
        sqlite3.connect(os.path.join(root, "x.db")).execute("create table t(a)")
except EscapeError as exc:
    print("EscapeError:", exc)
print("escapes:", len(fs.escapes))
print("real:", sorted(os.listdir(root)))
print("restored:", "patched" if hasattr(sqlite3.connect, "__wrapped__") else "real")
"""


def test_sqlite3_imported_inside_the_faultfs_is_refused_at_connect(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", LATE_SQLITE, str(root)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    out = done.stdout
    assert f"EscapeError: sqlite3.connect('{root}/x.db') opens a database under the" in out
    assert "escapes: 1" in out
    assert "real: []" in out  # nothing reached the real disk
    assert "restored: real" in out  # the patch ends with the FaultFS


def test_c_code_writing_under_a_real_root_stops_the_run_at_exit(tmp_path: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fs = FaultFS(tmp_path)
    with pytest.raises(EscapeError) as caught, fs:
        with open(fs.path("model.txt"), "w") as handle:
            handle.write("simulated")
        fd = libc.open(os.fsencode(tmp_path / "c.bin"), os.O_CREAT | os.O_WRONLY, 0o644)
        assert fd >= 0
        libc.write(fd, b"x", 1)
        libc.close(fd)
    message = str(caught.value)
    assert message.startswith(f"c.bin appeared on the real disk under the FaultFS root {tmp_path}")
    assert fs.escapes == [message]
    assert sorted(os.listdir(tmp_path)) == ["c.bin"]  # model.txt went to the model


def test_a_plain_faultfs_that_only_used_os_and_io_exits_cleanly(tmp_path: Path) -> None:
    fs = FaultFS(tmp_path)
    for value in (b"1", b"2"):
        with fs:
            with open(fs.path("state"), "wb") as handle:
                handle.write(value)
    assert fs.escapes == [] and os.listdir(tmp_path) == []
    assert fs.read_file("state") == b"2"
