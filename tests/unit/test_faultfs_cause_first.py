"""What wrote the real directory under the root is said first, not 'point the code at the root'.

A C library writing the root around Python's os and io passes no boundary; the
no_boundaries advice ("build its paths with fs.path") came first and was wrong,
and the real cause followed chained after it.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from faultfs import HealthCheck, explore
from faultfs._health import check_boundaries
from faultfs.errors import EscapeError, FailedHealthCheck
from tests.support.pytest_run import run_pytest

_libc = ctypes.CDLL(None, use_errno=True)


def _c_write(path: str) -> None:
    """What a C extension does: open(2) and write(2) from C, unseen by faultfs."""
    fd = _libc.open(path.encode(), os.O_WRONLY | os.O_CREAT, 0o644)
    assert fd >= 0, ctypes.get_errno()
    _libc.write(fd, b"x", 1)
    _libc.close(fd)


def test_explore_names_the_real_disk_first(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()

    def workload(fs: object) -> None:
        _c_write(str(root / "data.mdb"))

    with pytest.raises(EscapeError) as caught:
        explore(workload, lambda img: None, root=str(root))
    text = str(caught.value)
    assert text.startswith("data.mdb appeared on the real disk")
    assert "passed no boundary" in text  # what followed, said after the cause
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_the_no_boundaries_advice_mentions_writes_around_os_and_io() -> None:
    class Quiet:
        root = "/r"
        boundaries = 0

    with pytest.raises(FailedHealthCheck) as caught:
        check_boundaries(Quiet(), "the test", frozenset())  # type: ignore[arg-type]
    assert caught.value.health_check is HealthCheck.no_boundaries
    assert "C extension" in str(caught.value) and "what appeared there" in str(caught.value)


FIXTURE_TESTS = """
import ctypes, os

_libc = ctypes.CDLL(None, use_errno=True)

def c_write(path):
    fd = _libc.open(path.encode(), os.O_WRONLY | os.O_CREAT, 0o644)
    assert fd >= 0
    _libc.write(fd, b"x", 1)
    _libc.close(fd)

def test_c_write_only(faultfs):
    c_write(faultfs.path("data.mdb"))

def test_c_write_then_a_read_fails(faultfs):
    c_write(faultfs.path("data.mdb"))
    with open(faultfs.path("data.mdb"), "rb") as handle:  # the model never saw it
        handle.read()
"""


def test_the_fixture_names_the_real_disk_first(tmp_path: Path) -> None:
    # The fixture said "passed no boundary ... point the code at the root" and only
    # the teardown's error named the file a C library wrote: the cause came second.
    (tmp_path / "test_cext.py").write_text(FIXTURE_TESTS)
    result = run_pytest(tmp_path, "-rA")
    out = result.stdout + result.stderr
    lines = [line for line in out.splitlines() if " test_cext.py::" in line]
    assert sorted(line.split(" - ")[0] for line in lines) == [
        "FAILED test_cext.py::test_c_write_only",
        "FAILED test_cext.py::test_c_write_then_a_read_fails",
    ], out  # failed once each: no second report at teardown
    failures = out.split("_ test_c_write_only _")[1].split("short test summary")[0]
    only, then = failures.split("_ test_c_write_then_a_read_fails _")
    assert "faultfs: data.mdb appeared on the real disk under the FaultFS root" in only, out
    assert "passed no boundary" not in out, out
    # the cause first, then the error it explains, not "During handling of ..." before it
    assert then.strip("_ \n").startswith("faultfs: data.mdb appeared on the real disk"), out
    assert "The test then failed with FileNotFoundError" in then, out
    assert "During handling" not in then, out
