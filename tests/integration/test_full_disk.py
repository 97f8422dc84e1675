"""A real full disk (a small tmpfs filled to the last byte) refuses a write cleanly.

A refused ``agent create`` (its first record could not be written) was not
acknowledged, so it must leave nothing behind: no session directory, no temp
file, which fsck would report as a creation a crash cut short (damage), and
after ``--repair`` as an unrecoverable session.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat import compaction, segments
from substrat.client import stop_daemon
from substrat.eventlog import read_log
from substrat.session import SessionState, SessionStore
from tests.support import mounts, roots
from tests.support.cli import kill_daemon


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


def test_a_segment_sealed_before_the_disk_filled_is_reported_sealed(
    disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills between a roll's rename and its start record (the seam: the start
    record's write fills it first): the segment is sealed, and the report says so, with
    the record missing and nothing lost, not as a failed seal."""
    root = disk / "root"
    for args in (("agent", "create", "lead"), ("agent", "send", "lead", "hello")):
        assert roots.cli(root, *args).returncode == 0
    assert roots.cli(root, "daemon", "stop").returncode == 0
    entries = len(read_log(next((root / "agents").iterdir()) / "events.jsonl").entries)
    write_start = segments.write_start
    filled: list[Path] = []

    def full_first(log_path: Path, first: int) -> None:
        if not filled:
            filled.append(mounts.fill(disk))
        write_start(log_path, first)

    monkeypatch.setattr(segments, "write_start", full_first)
    report = compaction.compact(root, segment_bytes=1)
    monkeypatch.undo()
    assert filled, "no roll reached its start record"
    sealed = list(root.glob("agents/*/events.0*"))
    assert len(sealed) == 1 and report.sealed == 1, (sealed, report)
    said = [e for e in report.errors if "start record" in e]
    assert len(said) == 1 and "nothing is lost" in said[0], report.errors
    assert not [e for e in report.errors if e.startswith("sealing") and e not in said]

    filled[0].unlink()
    checked = roots.cli(root, "fsck")
    assert checked.returncode in (0, 1), checked.stdout + checked.stderr
    assert not [f for f in json.loads(checked.stdout)["findings"] if f["severity"] == "damage"]
    listed = json.loads(roots.cli(root, "agent", "list").stdout)
    assert [a["path"] for a in listed] == ["lead"]
    assert roots.cli(root, "agent", "send", "lead", "again").returncode == 0  # it writes it
    assert roots.cli(root, "daemon", "stop").returncode == 0
    agent = next((root / "agents").iterdir())
    assert (agent / "events.start").is_file()
    history = sum(len(read_log(s).entries) for s in [*sealed, agent / "events.jsonl"])
    assert history >= entries


def test_compact_on_a_full_disk_says_to_free_space_and_loses_nothing(disk: Path) -> None:
    """An operator compacts to make room; on a disk with none left every error line
    ends in the remedy (as the daemon's do), and the logs are what they were."""
    root = disk / "root"
    assert roots.cli(root, "agent", "create", "lead").returncode == 0
    for n in range(6):
        assert roots.cli(root, "agent", "send", "lead", f"turn {n} " + "x" * 200).returncode == 0
    assert roots.cli(root, "daemon", "stop").returncode == 0
    filler = mounts.fill(disk)

    done = roots.cli(root, "compact", "--policy", "delete", "--segment-bytes", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    errors = json.loads(done.stdout)["errors"]
    assert errors, done.stdout
    remedy = "the disk is full: free space on the root's file system"
    assert all(remedy in e for e in errors), errors
    warned = [line for line in done.stderr.splitlines() if "failed" in line]
    assert all(remedy in line for line in warned), done.stderr
    assert "Traceback" not in done.stderr

    filler.unlink()
    checked = roots.cli(root, "fsck")
    assert not [f for f in json.loads(checked.stdout)["findings"] if f["severity"] == "damage"]
    assert roots.cli(root, "compact").returncode == 0
    history = json.loads(roots.cli(root, "log", "lead").stdout)["turns"]
    assert [t["prompt"].split()[1] for t in history] == [str(n) for n in range(6)]


def test_a_create_refused_on_a_full_disk_says_to_free_space(disk: Path) -> None:
    """The refusal names the remedy, as a refused send does: the write that failed
    (the record's atomic write) keeps its ENOSPC as its cause."""
    root = disk / "root"
    assert roots.cli(root, "agent", "create", "lead").returncode == 0
    filler = mounts.fill(disk)
    refused = roots.cli(root, "agent", "create", "second", as_json=False)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert "not acknowledged" in said, said
    assert "The disk is full: free space on the root's file system" in said, said
    filler.unlink()


def test_agent_list_counts_agents_a_full_disk_held_back(disk: Path) -> None:
    """After a kill -9, a start on a full disk holds the agent back when recovery has to
    write for it (here the ACTIVE record an older substrat left, which recovery rewrites
    SUSPENDED: this one writes no ACTIVE record, so a kill alone leaves nothing to write,
    see the next test); plain `agent list` said "no agents yet: substrat agent create
    NAME", as if it were gone. It says how many are held and where to look."""
    root = disk / "root"
    assert roots.cli(root, "agent", "create", "lead").returncode == 0
    assert roots.cli(root, "agent", "send", "lead", "hello").returncode == 0
    kill_daemon(root)
    _leave_active(root)
    filler = mounts.fill(disk)
    assert roots.cli(root, "daemon", "start").returncode == 0
    held = json.loads(roots.cli(root, "daemon", "status").stdout)["unreadable"]
    assert len(held) == 1 and "free space" in held[0]["what_to_do"], held

    listed = roots.cli(root, "agent", "list", as_json=False)
    assert listed.returncode == 0, listed.stderr
    shown = " ".join(listed.stdout.split())
    assert "no agents yet" not in shown, shown
    assert "1 agent held back" in shown and "agent list --all" in shown, shown
    filler.unlink()
    assert roots.cli(root, "daemon", "restart").returncode == 0
    back = json.loads(roots.cli(root, "agent", "list").stdout)
    assert [a["path"] for a in back] == ["lead"]


def _leave_active(root: Path) -> None:
    """Make the root's one session record say ACTIVE, as an older substrat left it."""
    store = SessionStore(root)
    [session] = store.scan(quarantine=False).sessions
    session.state = SessionState.ACTIVE
    store.save(session)


def test_a_start_on_a_full_disk_after_a_kill_serves_the_agents_it_need_not_write_for(
    disk: Path,
) -> None:
    """A kill leaves no ACTIVE record (SessionStore.activate), so the start after it has no
    record to rewrite: on a full disk it serves the agent (before, its record's rewrite
    was refused and the agent held back until space was freed)."""
    root = disk / "root"
    assert roots.cli(root, "agent", "create", "lead").returncode == 0
    assert roots.cli(root, "agent", "send", "lead", "hello").returncode == 0
    kill_daemon(root)
    filler = mounts.fill(disk)
    assert roots.cli(root, "daemon", "start").returncode == 0
    assert json.loads(roots.cli(root, "daemon", "status").stdout)["unreadable"] == []
    listed = json.loads(roots.cli(root, "agent", "list").stdout)
    assert [a["path"] for a in listed] == ["lead"]
    filler.unlink()


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["PYTHONUNBUFFERED", "buffered"])
def test_daemon_log_lines_the_full_disk_refused_are_counted_not_a_cut_traceback(
    disk: Path, monkeypatch: pytest.MonkeyPatch, unbuffered: str
) -> None:
    """The background daemon logs to daemon.log on the full disk itself. A line the disk
    refuses, or cuts short, is counted and said on a line of its own once space is back:
    not `--- Logging error ---` and a cut traceback into the same full file, and not lost
    without a word (with PYTHONUNBUFFERED, as in the landing runs, Python's stderr drops
    the rest of a short write and reports nothing)."""
    monkeypatch.setenv("PYTHONUNBUFFERED", unbuffered)  # the daemon the CLI starts inherits it
    root = disk / "root"
    assert roots.cli(root, "agent", "create", "lead").returncode == 0
    filler = mounts.fill(disk)
    log_path = root / "daemon.log"
    refused = False
    for n in range(60):  # each failed send logs a line, until the log's last page is full
        lines = log_path.read_bytes().count(b"\n")
        failed = roots.cli(root, "agent", "send", "lead", f"full {n} " + "y" * 300).returncode
        if failed and log_path.read_bytes().count(b"\n") == lines:
            refused = True  # its line was refused or cut short
            break
    assert refused, "no log line was refused: the disk never filled up"
    filler.unlink()
    assert roots.cli(root, "agent", "send", "lead", "space again").returncode == 0
    assert roots.cli(root, "daemon", "stop").returncode == 0
    text = log_path.read_text(errors="replace")
    assert "Logging error" not in text and "Traceback" not in text, text[-3000:]
    notes = [line for line in text.splitlines() if "could not be written" in line]
    assert len(notes) == 1, text[-3000:]
    assert re.fullmatch(
        r"\(substrat: \d+ log line\(s\) before this one could not be written: "
        r"No space left on device\)",
        notes[0],
    ), notes  # on a line of its own: a cut line was ended first
    assert text.endswith("stopped cleanly: sessions suspended\n"), text[-500:]


def test_a_send_refused_on_a_full_disk_tells_the_operator_what_to_do(disk: Path) -> None:
    """The refusal ended in "(reopen the log before writing again)", a note for the
    library's caller: the daemon reopens the log itself. The operator reads the remedy
    and that nothing acknowledged is lost; the send works again once space is back."""
    root = disk / "root"
    assert roots.cli(root, "agent", "create", "lead").returncode == 0
    filler = mounts.fill(disk)
    for n in range(60):  # the log's last page may still hold a few turns
        refused = roots.cli(root, "agent", "send", "lead", f"full {n} " + "y" * 300, as_json=False)
        if refused.returncode != 0:
            break
    assert refused.returncode != 0, refused.stdout
    said = " ".join(refused.stderr.split())
    assert "reopen the log" not in said, said
    assert "free space on the root's file system" in said, said
    assert said.endswith("(nothing acknowledged is lost; try again once that is fixed)"), said
    filler.unlink()
    assert roots.cli(root, "agent", "send", "lead", "space again").returncode == 0
