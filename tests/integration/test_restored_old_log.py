"""A log put back from an older backup is shorter than its checkpoint: fsck and the
daemon's start say that entries are missing (docs/daemon.md, fsck's
``log_behind_checkpoint``).

An outside review restored ``agents/`` from an older backup under a root whose
checkpoints were newer: fsck called it a checkpoint problem ("recovery reads that log in
full", repaired by dropping the checkpoint, then "clean") and the daemon's start said
nothing, while turns the checkpoint had seen in the log were gone. Real CLI processes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import SUBSTRAT, cli_root, run

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def restore_older_log(root: Path, tmp_path: Path) -> None:
    """Two turns acknowledged after a backup of the lead's log, then that backup restored."""
    assert run(root, "agent", "create", "lead").returncode == 0
    assert run(root, "agent", "send", "lead", "one").returncode == 0
    assert run(root, "daemon", "stop").returncode == 0  # a clean stop checkpoints the log
    (log,) = root.glob("agents/*/events.jsonl")
    backup = tmp_path / "events.jsonl.backup"
    shutil.copy2(log, backup)
    for prompt in ("two", "three"):
        assert run(root, "agent", "send", "lead", prompt).returncode == 0
    assert run(root, "daemon", "stop").returncode == 0
    shutil.copy2(backup, log)  # the older copy restored


def test_an_older_copy_of_a_log_is_reported_as_missing_entries(root: Path, tmp_path: Path) -> None:
    restore_older_log(root, tmp_path)

    fsck = run(root, "--json", "fsck")
    assert fsck.returncode == 1, fsck.stderr
    kinds = {f["kind"]: f for f in json.loads(fsck.stdout)["findings"]}
    assert "log_behind_checkpoint" in kinds and "checkpoint_mismatch" not in kinds, kinds
    assert "missing" in kinds["log_behind_checkpoint"]["detail"]

    assert run(root, "daemon", "start").returncode == 0
    said = (root / "daemon.log").read_text()
    assert "is shorter than its checkpoint" in said and "restore a newer copy" in said
    status = run(root, "daemon", "status")
    assert "is shorter than its checkpoint" in status.stdout, status.stdout
