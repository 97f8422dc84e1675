"""A real full disk (a small tmpfs filled to the last byte) refuses a write cleanly.

A refused ``agent create`` (its first record could not be written) was not
acknowledged, so it must leave nothing behind: no session directory, no temp
file, which fsck would report as a creation a crash cut short (damage), and
after ``--repair`` as an unrecoverable session.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.client import stop_daemon
from tests.support import mounts, roots


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with mounts.tmpfs(tmp_path / "mnt", "512k", "to fill") as mount_point:
        yield mount_point
        (mount_point / "filler").unlink(missing_ok=True)  # room for a clean stop
        stop_daemon(mount_point / "root", timeout_s=30)


def test_a_create_refused_on_a_full_disk_leaves_nothing(disk: Path) -> None:
    root = disk / "root"
    made = roots.cli(root, "agent", "create", "lead")
    assert made.returncode == 0, made.stderr
    before = {p.name for p in (root / "agents").iterdir()}
    filler = mounts.fill(disk)

    refused = roots.cli(root, "agent", "create", "second")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "not acknowledged" in json.loads(refused.stderr)["error"]["message"]
    assert {p.name for p in (root / "agents").iterdir()} == before, "no directory left"
    assert not list(root.rglob("*.tmp")), list(root.rglob("*.tmp"))

    filler.unlink()
    assert roots.cli(root, "daemon", "stop").returncode == 0
    checked = roots.cli(root, "fsck")
    findings = json.loads(checked.stdout)["findings"]
    assert [f for f in findings if f["severity"] != "notice"] == [], findings
    assert checked.returncode == 0
    again = roots.cli(root, "agent", "create", "second")
    assert again.returncode == 0, again.stderr
    listed = json.loads(roots.cli(root, "agent", "list").stdout)
    assert sorted(a["path"] for a in listed) == ["lead", "second"]
