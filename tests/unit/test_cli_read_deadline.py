"""tests/support/cli's readers honour their deadline: a follower that never prints
fails the test with what it awaited, not pytest's timeout minutes later."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import read_json_until, read_lines_until


@pytest.fixture
def silent() -> Iterator[subprocess.Popen[str]]:
    """A process that prints one line, then nothing (its stdout stays open)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('hello', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    yield proc
    proc.kill()
    proc.communicate()


def test_a_silent_process_fails_the_read_by_its_deadline(silent: subprocess.Popen[str]) -> None:
    start = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        read_lines_until(silent, lambda line: "never printed" in line, timeout_s=1)
    # a correctness check of the deadline (1 s), not a speed bound: a blocking read
    # would wait the 600 s the process sleeps
    assert time.monotonic() - start < 30
    message = str(failure.value)
    assert "timed out after 1 s" in message, message
    assert '"never printed" in line' in message, message  # what was awaited
    assert "['hello\\n']" in message, message  # the lines seen so far


def test_json_reads_name_what_they_awaited(silent: subprocess.Popen[str]) -> None:
    with pytest.raises(AssertionError) as failure:
        read_json_until(silent, lambda e: e["event"] == "turn.completed", timeout_s=0.5)
    assert 'e["event"] == "turn.completed"' in str(failure.value), failure.value


def test_lines_after_the_awaited_one_are_kept_for_the_next_read() -> None:
    script = 'print(\'{"n": 1}\\n{"n": 2}\\nlast\', flush=True)'
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert read_json_until(proc, lambda e: e["n"] == 1, timeout_s=30) == [{"n": 1}]
        assert read_json_until(proc, lambda e: e["n"] == 2, timeout_s=30) == [{"n": 2}]
        assert read_lines_until(proc, lambda line: True, timeout_s=30) == ["last\n"]
        with pytest.raises(AssertionError, match="ended early, before a line for which"):
            read_lines_until(proc, lambda line: True, timeout_s=30)
    finally:
        proc.communicate(timeout=30)


def test_a_process_that_closes_stdout_but_runs_on_fails_by_the_deadline(tmp_path: Path) -> None:
    """Its stderr stays open while it runs: reading it to the end would wait the 600 s."""
    ready = tmp_path / "ready"
    script = (
        "import os, sys, time; print('bye', flush=True); os.close(1); "
        "print('still here', file=sys.stderr, flush=True); open(sys.argv[1], 'w').close(); "
        "time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Its output is all in the pipes before the 1 s deadline starts: at a load of 15 a
    # Python start alone can take longer, and the read then timed out before "bye"
    # (a failure of the newcomer run, seed 29220).
    wait_start = time.monotonic()
    while not ready.exists():
        assert proc.poll() is None, proc.communicate(timeout=30)
        assert time.monotonic() - wait_start < 120, "the child never got going"
        time.sleep(0.01)
    try:
        start = time.monotonic()
        with pytest.raises(AssertionError) as failure:
            read_lines_until(proc, lambda line: "never" in line, timeout_s=1)
        assert time.monotonic() - start < 30  # the deadline (1 s) held, not the 600 s sleep
        message = str(failure.value)
        assert "ended early" in message, message
        assert "still here" in message, message  # what it said on stderr so far
        assert "still running" in message, message
    finally:
        proc.kill()
        proc.communicate(timeout=30)
