"""A root moved, removed, restored over or reached through a repointed symlink while its
daemon runs
(docs/daemon.md, "A root moved while its daemon runs"; substrat/rootguard.py).

An outside review (an operator running several roots on one machine) found the daemon
writing at the path it was started with whatever that path named later: a spawn and an
inbox message written into a new root made at a moved root's old path, a turn
acknowledged after a move to another file system that the moved root did not have, and
a daemon started through a ``current`` symlink writing its turn into the log of the
root the link was repointed to. Real daemons, real CLI processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.rootguard import CHECK_ENV
from substrat.rpc import lock
from tests.support.cli import SUBSTRAT, cli_roots, run, spawn, wait_busy

pytestmark = [
    pytest.mark.waits,
    pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed"),
]


@pytest.fixture
def roots() -> Iterator[list[Path]]:
    yield from cli_roots()


@pytest.fixture
def guard_looks_often(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemons a test starts check their root every 50 ms, not every second: the tests
    of a moved root wait for the daemon to notice, and with the default they waited up to
    a second each for nothing they check. Not the restore tests: a guard that looks while
    the restore still runs writes its note into a ``daemon.log`` that the restore then
    replaces with the backup's (seen: tar, at load 20), and those tests read the note.
    test_cli_commands.py's test of a moved root keeps the default too."""
    monkeypatch.setenv(CHECK_ENV, "0.05")


def daemon_pid(root: Path) -> int:
    info = lock.read_info(root)
    assert info is not None and info.pid is not None
    return info.pid


def wait_gone(pid: int, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_renamed_root_stops_its_daemon_and_its_turns_land_in_it(
    tmp_path: Path, roots: list[Path], guard_looks_often: None
) -> None:
    old, new = tmp_path / "team", tmp_path / "team-renamed"
    roots += [old, new]
    assert run(old, "agent", "create", "lead").returncode == 0
    pid = daemon_pid(old)
    os.rename(old, new)

    # the daemon cannot serve a root under two names: it stops (as a kill would)
    assert wait_gone(pid), "the daemon of a renamed root kept running"
    assert "no longer exists" in (new / "daemon.log").read_text()

    # a spawn and a message to the user, sent to the root's new path, land there: the
    # old daemon answered "committed, not fully applied" and wrote them at the old path
    sent = run(new, "agent", "send", "lead", "-", stdin="go\n@spawn kid dig\n@send user done\n")
    assert sent.returncode == 0, sent.stderr
    assert "spawned kid" in sent.stdout
    assert not old.exists(), "something was written at the root's old path"
    assert "done" in run(new, "inbox").stdout
    assert run(new, "daemon", "stop").returncode == 0
    fsck = run(new, "fsck")
    assert fsck.returncode == 0, fsck.stdout
    assert "kid" in run(new, "agent", "tree").stdout


def test_a_root_moved_away_mid_turn_is_not_acknowledged(
    tmp_path: Path, roots: list[Path], guard_looks_often: None
) -> None:
    # `mv` to another file system copies, then removes: the daemon's open log is then
    # a deleted file, and a turn it commits there is not in the moved root
    old, new = tmp_path / "team", tmp_path / "elsewhere"
    roots += [old, new]
    assert run(old, "agent", "create", "slow", "--provider", "paced").returncode == 0
    pid = daemon_pid(old)
    sender = spawn(old, "agent", "send", "slow", "@pace 8000ms a long one")
    wait_busy(old)
    subprocess.run(["cp", "-a", str(old), str(new)], check=True)
    shutil.rmtree(old)
    _, err = sender.communicate(timeout=60)

    assert sender.returncode == 3, err  # the daemon's death, not "✓ turn t1 committed"
    assert "committed" not in err.replace("not committed", "")
    assert wait_gone(pid)
    log = run(new, "log", "slow")
    assert "no completed turns" in log.stdout, log.stdout
    again = run(new, "agent", "send", "slow", "after the move")
    assert again.returncode == 0, again.stderr
    assert "after the move" in run(new, "log", "slow").stdout


def test_a_daemon_started_through_a_symlink_keeps_its_root_when_the_link_moves(
    tmp_path: Path, roots: list[Path]
) -> None:
    blue, green, current = tmp_path / "blue", tmp_path / "green", tmp_path / "current"
    roots += [blue, green]
    blue.mkdir(mode=0o700)
    current.symlink_to(blue)
    assert run(current, "agent", "create", "lead").returncode == 0
    assert run(current, "agent", "send", "lead", "one").returncode == 0
    assert run(current, "daemon", "stop").returncode == 0
    subprocess.run(["cp", "-a", str(blue), str(green)], check=True)  # same agent ids
    assert run(current, "daemon", "start").returncode == 0
    green_logs = {p: p.read_bytes() for p in green.glob("agents/*/events.jsonl")}

    current.unlink()
    current.symlink_to(green)  # blue/green: the link now names the other root
    sent = run(blue, "agent", "send", "lead", "two")  # to blue's daemon, by its real path
    assert sent.returncode == 0, sent.stderr

    assert {p: p.read_bytes() for p in green.glob("agents/*/events.jsonl")} == green_logs
    assert "two" in run(blue, "log", "lead").stdout
    assert run(blue, "daemon", "stop").returncode == 0
    assert run(blue, "fsck").returncode == 0


def restore_like_rsync(backup: Path, root: Path) -> None:
    """``rsync -a backup/ root/`` as rsync writes: each file to a temporary name in its
    directory, then renamed over the live one (rsync itself is not installed everywhere)."""
    for source in sorted(backup.rglob("*")):
        target = root / source.relative_to(backup)
        if source.is_dir() or source.is_socket():
            continue
        temp = target.with_name(f".{target.name}.rsync")
        temp.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, temp)
        os.replace(temp, target)


@pytest.mark.parametrize("tool", ["tar", "rsync"])
def test_a_backup_restored_over_the_running_root_stops_its_daemon(
    tmp_path: Path, roots: list[Path], tool: str
) -> None:
    # the restored files are new inodes (tar unlinks each file and creates it again, rsync
    # renames a copy over it): the daemon would go on appending to the old, deleted logs
    # and acknowledge turns the restored root never gets
    root, backup = tmp_path / "team", tmp_path / "backup"
    roots.append(root)
    assert run(root, "agent", "create", "lead").returncode == 0
    assert run(root, "agent", "send", "lead", "one").returncode == 0
    archive = tmp_path / "team.tar"
    subprocess.run(["cp", "-a", str(root), str(backup)], check=True)
    subprocess.run(["tar", "-C", str(tmp_path), "-cf", str(archive), "team"], capture_output=True)
    pid = daemon_pid(root)
    assert run(root, "agent", "send", "lead", "two").returncode == 0
    if tool == "tar":
        subprocess.run(["tar", "-C", str(tmp_path), "-xf", str(archive)], check=True)
    else:
        restore_like_rsync(backup, root)

    assert wait_gone(pid), "the daemon kept serving the files the restore replaced"
    assert "was replaced or removed" in (root / "daemon.log").read_text()
    sent = run(root, "agent", "send", "lead", "three")
    assert sent.returncode == 0, sent.stderr
    history = run(root, "log", "lead").stdout
    assert "three" in history and "one" in history, history
