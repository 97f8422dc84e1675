"""A library's first tempfile use inside the run says what to do, in a plain script too."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os, sys, tempfile
assert tempfile.tempdir is None  # a fresh interpreter: tempfile has not looked yet
from faultfs import explore

def workload(fs):
    fd, tmp = tempfile.mkstemp()
    os.close(fd)
    os.replace(tmp, fs.path("state"))
    fs.ack(1)

explore(workload, lambda img: None)
"""


def test_first_mkstemp_inside_the_run_is_refused_with_the_fix() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode != 0
    assert "No usable temporary directory" not in out.stderr
    assert "OutsideRootError" in out.stderr
    assert "this is tempfile's default directory" in out.stderr
