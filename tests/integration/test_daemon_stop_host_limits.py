"""`daemon stop` when the host refuses the clean stop's writes says what happened.

On a full disk the clean stop cannot write its start summary: `daemon stop` said only
"daemon stopped". On a root whose file system turned read-only it pointed at a
daemon.log that could not be written. Both lose nothing (the next start reads the logs).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat import start_summary
from substrat.client import stop_daemon
from substrat.rpc import lock
from tests.support import mounts, roots


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with mounts.tmpfs(tmp_path / "mnt", "512k", "to fill") as mount_point:
        yield mount_point
        (mount_point / "filler").unlink(missing_ok=True)
        stop_daemon(mount_point / "root", timeout_s=30)


def test_daemon_stop_on_a_full_disk_says_the_start_summary_was_not_saved(disk: Path) -> None:
    root = disk / "root"
    assert roots.cli(root, "agent", "create", "lead").returncode == 0
    assert roots.cli(root, "agent", "send", "lead", "hello").returncode == 0
    assert roots.cli(root, "daemon", "restart").returncode == 0  # its session suspended
    filler = mounts.fill(disk)
    stopped = roots.cli(root, "daemon", "stop", as_json=False)
    assert stopped.returncode == 0, stopped.stderr + (root / "daemon.log").read_text()[-2000:]
    assert "daemon stopped" in stopped.stdout, stopped.stdout + (root / "daemon.log").read_text()
    said = " ".join(stopped.stderr.split())
    assert "the start summary was not saved (No space left on device)" in said, said
    assert "nothing is lost, the next start reads the logs instead" in said, said
    info = lock.read_info(root)
    assert info is not None and info.state == "stopped", info
    assert not Path(start_summary.summary_path(root)).exists()
    log = (root / "daemon.log").read_text()
    assert "stopped cleanly: sessions suspended; the start summary was not saved" in log

    filler.unlink()  # and it was true: the next start has every turn
    history = json.loads(roots.cli(root, "log", "lead").stdout)["turns"]
    assert [t["prompt"] for t in history] == ["hello"]
    again = roots.cli(root, "daemon", "stop", as_json=False)
    assert again.returncode == 0 and "not saved" not in again.stderr, again.stderr


@pytest.fixture
def failing_disk(tmp_path: Path) -> Iterator[Path]:
    with mounts.ext4_that_fails(
        tmp_path / "mnt", tmp_path / "ext4.img", "to turn read-only"
    ) as mount_point:
        try:
            yield mount_point
        finally:
            stop_daemon(mount_point / "root", timeout_s=30)


def test_daemon_stop_on_a_root_turned_read_only_says_so(failing_disk: Path) -> None:
    root = failing_disk / "root"
    assert roots.cli(root, "agent", "create", "lead").returncode == 0
    assert roots.cli(root, "agent", "send", "lead", "hello").returncode == 0
    mounts.fail_ext4(failing_disk)
    stopped = roots.cli(root, "daemon", "stop", as_json=False)
    assert stopped.returncode != 0, stopped.stdout
    said = " ".join(stopped.stderr.split())
    assert "exited without a clean shutdown" in said, said
    assert "the root's file system is read-only (daemon.log too): remount it read-write" in said, (
        said
    )
    assert "daemon.log for why" not in said, said  # it could not be written
    assert "Nothing acknowledged is lost" in said, said
