"""A library that opens a path from C or Rust is named, not taken for a lost file (review s27d).

``polars.read_csv(path)`` (and ``pyarrow.parquet.read_table``, ``pyarrow.csv.read_csv``)
opens the path itself, on the real disk, where the model's files are not: under the
``faultfs`` fixture it raised ``FileNotFoundError: No such file or directory (os error 2):
.../t.csv`` for the file the test had just written, and in explore's check every image
failed that way, so the report blamed missing fsyncs. The error names a path the model
holds, so the read went around Python's os and io: now an EscapeError says so.

``c_read`` does what such a binding does, through ctypes (polars and pyarrow are no dev
dependencies): C's fopen on the path, and on failure a FileNotFoundError whose message
quotes the path and whose ``filename`` is unset.
"""

from __future__ import annotations

import ctypes
import errno
import inspect
import os

import pytest

from faultfs import FaultFS, explore
from faultfs.errors import EscapeError
from tests.support.faultfs_classic import fsync_dir
from tests.support.pytest_run import run_pytest

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.fopen.restype = ctypes.c_void_p
_LIBC.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
_LIBC.fclose.argtypes = [ctypes.c_void_p]


def c_read(path: str) -> None:
    """A binding's read of ``path``: C's fopen, and polars' words when it fails."""
    stream = _LIBC.fopen(os.fsencode(path), b"rb")
    if not stream:
        code = ctypes.get_errno()
        if code == errno.ENOENT:
            raise FileNotFoundError(f"No such file or directory (os error 2): {path}")
        raise OSError(code, os.strerror(code))
    _LIBC.fclose(stream)


def save(fs: FaultFS) -> None:
    with open(fs.path("t.csv"), "w") as handle:
        handle.write("a\n1\n")
        handle.flush()
        os.fsync(handle.fileno())
    fsync_dir(fs.root)
    fs.ack(1)


def check_by_c_read(img: FaultFS) -> None:
    if img.acked:  # then t.csv is on the disk: the workload made it durable first
        c_read(img.path("t.csv"))


def test_explore_names_a_check_that_reads_the_real_disk_from_c() -> None:
    with pytest.raises(EscapeError) as caught:
        explore(save, check_by_c_read)
    words = str(caught.value)
    assert "t.csv' is on the simulated disk, but the code that raised FileNotFoundError" in words
    assert "opened it on the real disk, around Python's os and io" in words
    assert f"{os.path.basename(__file__)}:" in words  # the user's line, not faultfs's


def test_a_file_really_missing_is_still_the_check_s_finding() -> None:
    def lost(fs: FaultFS) -> None:
        with open(fs.path("t.csv"), "w") as handle:
            handle.write("a\n1\n")
        fs.ack(1)  # neither fsynced nor its entry: a power cut loses it

    def check(img: FaultFS) -> None:
        if img.acked and not os.path.exists(img.path("t.csv")):
            c_read(img.path("t.csv"))  # missing in the model too: the crash's doing

    report = explore(lost, check, modes=("power",))
    assert report.failures and not report.ok
    assert all("FileNotFoundError" in failure.error for failure in report.failures), report


def test_the_fixture_names_it_at_the_test_s_line(tmp_path) -> None:
    test = tmp_path / "test_c_read.py"
    source = inspect.getsource(c_read)
    test.write_text(
        "import ctypes, errno, os\n"
        "_LIBC = ctypes.CDLL(None, use_errno=True)\n"
        "_LIBC.fopen.restype = ctypes.c_void_p\n"
        "_LIBC.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]\n"
        "_LIBC.fclose.argtypes = [ctypes.c_void_p]\n"
        "def test_read(faultfs):\n"
        "    with open(faultfs.path('t.csv'), 'w') as handle:\n"
        "        handle.write('a')\n"
        "    c_read(faultfs.path('t.csv'))\n"
        f"{source}"
    )
    result = run_pytest(tmp_path, "test_c_read.py")
    assert result.returncode == 1, result.stdout
    assert "EscapeError: test_c_read.py:" in result.stdout.replace(f"{tmp_path}/", ""), (
        result.stdout
    )
    assert "is on the simulated disk" in result.stdout


def test_explore_names_a_workload_that_reads_back_from_c() -> None:
    def workload(fs: FaultFS) -> None:
        save(fs)
        c_read(fs.path("t.csv"))  # a store that loads what it saved, through a C reader

    with pytest.raises(EscapeError, match=r"t\.csv' is on the simulated disk, but the code"):
        explore(workload, check_by_c_read)


def test_a_c_write_under_a_real_root_names_polars_and_pyarrow(tmp_path) -> None:
    # polars' write_parquet(path) left "t.parquet appeared on the real disk ... C extensions
    # do their own I/O (sqlite3, LMDB, HDF5, ...)": the library a user had was not named.
    root = tmp_path / "root"
    root.mkdir()
    fs = FaultFS(str(root))
    with pytest.raises(EscapeError) as caught, fs:
        stream = _LIBC.fopen(os.fsencode(fs.path("t.parquet")), b"wb")
        _LIBC.fclose(stream)
    assert "t.parquet appeared on the real disk" in str(caught.value)
    assert "polars and pyarrow given a path: give them a file object from open()" in str(
        caught.value
    )
