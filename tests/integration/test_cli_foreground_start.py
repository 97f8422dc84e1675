"""``daemon start --foreground`` takes the root's start lock as a background start does
(substrat.rpc.starting): real processes.

It used to run the daemon at once: beside a start in progress (an autostarting command's,
a ``daemon restart``'s) or another foreground start, two daemons raced for the root and
the loser exited 3 saying the root was in use by "another substrat process (fsck, recover
or a starting daemon)". Now it waits for the start in progress, says so, and when that
start's daemon serves it names it and exits 3; the winner holds the lock until its own
daemon answers.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.client import ping, start_daemon
from substrat.rpc.starting import start_lock
from tests.support.cli import SUBSTRAT, cli_env, cli_root, read_lines_until, run

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def _foreground(root: Path) -> subprocess.Popen[str]:
    """``daemon start --foreground``, its stderr (the daemon's log too) on its stdout."""
    return subprocess.Popen(
        [SUBSTRAT, "daemon", "start", "--foreground"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=cli_env(root),
    )


def _stopped_root(root: Path) -> None:
    assert run(root, "daemon", "start").returncode == 0
    assert run(root, "daemon", "stop").returncode == 0


def _already(root: Path, pid: int) -> str:
    return (
        f"a daemon already serves {root} (pid {pid}); this terminal runs none: "
        f"`substrat daemon stop --root {root}` first to run it here"
    )


def test_a_foreground_start_waits_for_a_start_in_progress_and_names_its_daemon(
    root: Path,
) -> None:
    _stopped_root(root)
    with start_lock(root, 5):  # as another command's start holds it
        fg = _foreground(root)
        try:
            read_lines_until(fg, lambda line: "waiting for it" in line, timeout_s=60)
            assert ping(root) is None  # it waits: no daemon of its own
            pid, started = start_daemon(root, create=False, locked=True)  # that start's
            assert started
        except BaseException:
            fg.kill()
            raise
    out, _ = fg.communicate(timeout=120)
    assert fg.returncode == 3, out
    assert _already(root, pid) in " ".join(out.split()), out
    answer = ping(root)
    assert answer is not None and answer["pid"] == pid


def test_two_foreground_starts_run_one_daemon_and_the_other_says_so(root: Path) -> None:
    _stopped_root(root)
    starts = [_foreground(root) for _ in range(2)]
    try:
        deadline = time.monotonic() + 120
        while all(fg.poll() is None for fg in starts):  # the loser gives way once one serves
            assert time.monotonic() < deadline, "neither start gave way"
            time.sleep(0.05)
        loser = next(fg for fg in starts if fg.poll() is not None)
        winner = next(fg for fg in starts if fg is not loser)
        out, _ = loser.communicate(timeout=60)
        assert loser.returncode == 3, out
        answer = ping(root)
        assert answer is not None and answer["pid"] == winner.pid
        assert _already(root, winner.pid) in " ".join(out.split()), out
        winner.send_signal(signal.SIGTERM)
        assert winner.wait(timeout=60) == 0
    finally:
        for fg in starts:
            fg.kill()
            fg.wait()
