"""Acknowledging data still in a Python file object's buffer: the cause says so.

The commonest kill -9 bug (no flush before the acknowledgement) used to be
reported as "a crash right after the create ... make the update atomic".
"""

from __future__ import annotations

import io
import os

import pytest

from faultfs import FaultFS, explore
from faultfs._buffered import holds_data

ROOT = "/faultfs-buffered-ack"


def _check(img: FaultFS) -> None:
    try:
        with open(img.path("log"), "rb") as f:
            got = f.read()
    except FileNotFoundError:
        got = b""
    for i in img.acked:
        assert b"rec %d\n" % i in got


@pytest.mark.parametrize("mode", ["a", "ab", "w", "wb+"])
def test_an_ack_before_the_flush_is_named(mode: str) -> None:
    def workload(fs: FaultFS) -> None:
        with open(fs.path("log"), mode) as f:
            for i in range(3):
                line = f"rec {i}\n"
                f.write(line if "b" not in mode else line.encode())  # no flush
                fs.ack(i)

    report = explore(workload, _check, root=ROOT, modes="process")
    causes = report.causes()
    assert [c.kind for c in causes] == ["buffered-ack"]
    assert "still in the process's buffer" in causes[0].summary
    assert "f.flush()" in causes[0].fix and "atomic" not in causes[0].fix


def test_flushed_but_unsynced_is_an_fsync_cause_not_a_buffer_one() -> None:
    def workload(fs: FaultFS) -> None:
        with open(fs.path("log"), "a") as f:
            for i in range(2):
                f.write(f"rec {i}\n")
                f.flush()
                fs.ack(i)

    assert not explore(workload, _check, root=ROOT, modes="process").failures
    report = explore(workload, _check, root=ROOT, modes="power")
    kinds = {c.kind for c in report.causes()}
    assert "buffered-ack" not in kinds
    assert "unsynced-before-ack" in kinds


def test_data_that_reached_the_os_after_the_ack_is_not_blamed_on_the_buffer() -> None:
    """Once the buffer was written before the crash, a loss is the disk's (fsync), not it."""

    def workload(fs: FaultFS) -> None:
        with open(fs.path("log"), "a") as f:
            f.write("rec 0\n")
            fs.ack(0)
            f.flush()
            d = os.open(fs.root, os.O_RDONLY)
            os.fsync(d)
            os.close(d)

    report = explore(workload, _check, root=ROOT, modes=("process", "power"))
    before = {f.findings[0].kind for f in report.failures if f.op.kind != "fsync" and f.findings}
    after = {f.findings[0].kind for f in report.failures if f.op.kind == "fsync" and f.findings}
    assert "buffered-ack" in before  # crashed before the flush
    assert after and "buffered-ack" not in after  # after it: the file's fsync is missing


def test_holds_data_reads_without_flushing() -> None:
    raw = io.BytesIO()
    binary = io.BufferedWriter(raw)
    binary.write(b"abc")
    assert holds_data(binary) and raw.getvalue() == b""
    binary.flush()
    assert not holds_data(binary)
    text = io.TextIOWrapper(io.BufferedWriter(io.BytesIO()), "utf-8", newline="")
    assert not holds_data(text)
    text.write("record\n")
    assert holds_data(text)
    text.flush()
    assert not holds_data(text)
