"""Scratch directories in the temp directory: what a killed owner leaves is removed, a live
owner's never (real processes, real ``flock``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from substrat.providers.scratch import LOCK_NAME, STAGING_MARK, make_scratch, sweep_dead

PREFIX = "substrat-test-"
HOLDER = """
import sys, time
from substrat.providers.scratch import make_scratch
scratch = make_scratch(sys.argv[1], sys.argv[2])
print(scratch.path, flush=True)
time.sleep(60)
"""


def start_owner(base: Path) -> tuple[subprocess.Popen[str], Path]:
    """A process that makes a scratch directory under ``base`` and keeps it."""
    owner = subprocess.Popen(
        [sys.executable, "-c", HOLDER, PREFIX, str(base)], stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    return owner, Path(owner.stdout.readline().strip())


def test_a_killed_owners_directory_is_removed_and_a_live_owners_kept(tmp_path: Path) -> None:
    dead, dead_dir = start_owner(tmp_path)
    live, live_dir = start_owner(tmp_path)
    try:
        os.kill(dead.pid, signal.SIGKILL)
        dead.wait()
        assert dead_dir.is_dir() and (dead_dir / LOCK_NAME).exists()  # kill -9 cleans nothing
        assert sweep_dead(PREFIX, str(tmp_path)) == [dead_dir]
        assert not dead_dir.exists()
        assert live_dir.is_dir()
        assert sweep_dead(PREFIX, str(tmp_path)) == []
    finally:
        live.kill()
        live.wait()
    assert sweep_dead(PREFIX, str(tmp_path)) == [live_dir]


def test_the_first_scratch_of_a_process_sweeps_first(tmp_path: Path) -> None:
    dead, dead_dir = start_owner(tmp_path)
    dead.kill()
    dead.wait()
    mine = make_scratch(PREFIX, str(tmp_path))
    try:
        assert not dead_dir.exists()
        assert mine.path.is_dir() and mine.path.name.startswith(PREFIX)
        assert STAGING_MARK not in mine.path.name
        assert (mine.path.stat().st_mode & 0o777) == 0o700
        assert sweep_dead(PREFIX, str(tmp_path)) == []  # this process holds it
    finally:
        mine.remove()
    assert not mine.path.exists()
    mine.remove()  # a second call does nothing


@pytest.mark.parametrize("kind", ["no lock file", "symlink", "staging", "other prefix"])
def test_what_is_not_a_dead_owners_directory_is_left_alone(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / LOCK_NAME).touch()  # an unheld lock: removed if the sweep followed anything
    if kind == "no lock file":
        left = tmp_path / f"{PREFIX}older"
        left.mkdir()
    elif kind == "symlink":
        left = tmp_path / f"{PREFIX}link"
        left.symlink_to(target)
    elif kind == "staging":
        left = tmp_path / f"{PREFIX}{STAGING_MARK}abc"
        left.mkdir()
        (left / LOCK_NAME).touch()  # its owner may be about to lock it
    else:
        left = tmp_path / "someone-else-abc"
        left.mkdir()
        (left / LOCK_NAME).touch()
    assert sweep_dead(PREFIX, str(tmp_path)) == []
    assert left.exists() and (target / LOCK_NAME).exists()
