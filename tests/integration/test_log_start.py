"""Where a log starts, said durably: the start record (``events.start``, issue 16).

A log whose every sealed segment was removed by hand used to read as if it
started at entry 1: recovery served what was left, fsck saw nothing, and the
next entry could even be numbered 1 again. The start record, written when a
segment rolls, lets every reader tell "entries 1..N-1 are gone" from "the first
line was damaged" (which must cost only that line).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from substrat import fsck
from substrat.checkpoints import CHECKPOINTS_DIR
from substrat.conversation import ConversationGone, conversation_from_log
from substrat.eventlog import EventLog, read_log
from substrat.logbase import first_kept
from substrat.segments import (
    START_NAME,
    StartUnreadable,
    active_first,
    list_sealed,
    read_start,
    roll,
)
from tests.integration.test_checkpoints import agent_dirs, build_root, reopen


def _remove_every_segment(log: Path) -> int:
    """Remove the log's sealed segments by hand; the entry its active file starts at."""
    sealed = list_sealed(log)
    assert sealed, "the workload must have sealed a segment"
    for segment in sealed:
        segment.path.unlink()
    return active_first(sealed)


def test_a_roll_records_where_the_active_file_starts(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    with EventLog(log) as writer:
        for i in range(3):
            writer.log("x", {"i": i})
    assert read_start(log) is None  # never sealed: nothing to say
    roll(log, 1, 3)
    assert read_start(log) == 4 and (tmp_path / START_NAME).exists()
    with EventLog(log) as writer:
        assert writer.log("x", {"i": 3}) == 4


def test_every_segment_removed_by_hand_without_a_checkpoint_is_held_back(
    tmp_path: Path,
) -> None:
    root = build_root(tmp_path)
    lead = agent_dirs(root)["lead"]
    starts = _remove_every_segment(lead / "events.jsonl")
    assert starts > 1 and read_start(lead / "events.jsonl") == starts
    assert first_kept(lead / "events.jsonl") == starts
    found = fsck.check(root)
    missing = [f for f in found.findings if f.kind == "missing_segment"]
    assert len(missing) == 1 and f"entries 1..{starts - 1}" in missing[0].detail, found.findings
    with pytest.raises(ConversationGone):
        conversation_from_log(lead / "events.jsonl")
    shutil.rmtree(root / CHECKPOINTS_DIR)  # nothing says what the removed entries held
    snap, report = reopen(root)
    held = {u.session_id: u for u in report.unreadable}
    assert lead.name in held, report.unreadable
    assert f"starts at entry {starts}" in held[lead.name].error
    assert "lead" not in snap["agents"]


def test_every_segment_removed_with_a_checkpoint_that_holds_keeps_the_state(
    tmp_path: Path,
) -> None:
    root = build_root(tmp_path)
    lead = agent_dirs(root)["lead"]
    whole, _ = reopen(root)
    _remove_every_segment(lead / "events.jsonl")
    snap, report = reopen(root)  # the store's checkpoint is in the active file: it holds
    assert report.unreadable == [] and lead.name not in report.checkpoints_rejected
    state = {k: v for k, v in snap["agents"]["lead"].items() if k != "history"}
    assert state == {k: v for k, v in whole["agents"]["lead"].items() if k != "history"}
    assert snap["agents"]["lead"]["history"] == "gone"  # never a shorter conversation


def test_numbering_goes_on_past_the_record_when_every_segment_is_gone(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    with EventLog(log) as writer:
        for i in range(5):
            writer.log("x", {"i": i})
    roll(log, 1, 5)
    _remove_every_segment(log)
    with EventLog(log) as writer:
        assert writer.log("x", {}) == 6  # never entry 1 again


def test_a_damaged_record_costs_only_itself(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    lead = agent_dirs(root)["lead"]
    log = lead / "events.jsonl"
    record = lead / START_NAME
    entries = len(read_log(log).entries)
    record.write_bytes(record.read_bytes()[:-8] + b"garbage\n")
    with pytest.raises(StartUnreadable):
        read_start(log)
    # with its segments there, their names still say it: repaired from them
    found = fsck.check(root)
    damaged = [f for f in found.findings if f.kind == "damaged_start"]
    assert len(damaged) == 1 and damaged[0].repair, found.findings
    assert "missing_segment" not in found.kinds()
    snap, report = reopen(root)
    assert "lead" in snap["agents"] and report.unreadable == []
    assert len(read_log(log).entries) == entries  # no entry lost to it
    repaired = fsck.check(root, repair=True)
    assert [f.repaired for f in repaired.findings if f.kind == "damaged_start"] == [True]
    assert read_start(log) == active_first(list_sealed(log))
    # with every segment gone too, nothing says where the log starts: reported, and
    # the log is read as it is (as a log from before the record would be)
    _remove_every_segment(log)
    record.write_bytes(b"\x00" * 40)
    found = fsck.check(root)
    damaged = [f for f in found.findings if f.kind == "damaged_start"]
    assert len(damaged) == 1 and damaged[0].repair is None, found.findings
    assert "cannot be told" in damaged[0].detail and "backup" in damaged[0].detail


def test_a_root_from_before_the_record_opens_and_gets_one(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    whole, _ = reopen(root)
    records = list(root.rglob(START_NAME))
    assert records
    for record in records:
        record.unlink()
    snap, report = reopen(root)
    assert snap == whole and report.unreadable == []
    assert "missing_segment" not in fsck.check(root).kinds()
    lead = agent_dirs(root)["lead"]
    EventLog(lead / "events.jsonl").close()  # an open for appending writes it
    assert read_start(lead / "events.jsonl") == active_first(list_sealed(lead / "events.jsonl"))


def test_a_roll_cut_short_by_a_crash_is_finished_by_the_next_open(tmp_path: Path) -> None:
    """A crash after the rename and before the new active file and its record: the
    segment's name says where the log goes on, and the next open for appending creates
    both (the record never ahead of the log)."""
    log = tmp_path / "events.jsonl"
    with EventLog(log) as writer:
        for i in range(4):
            writer.log("x", {"i": i})
    roll(log, 1, 4)
    log.unlink()
    (tmp_path / START_NAME).unlink()
    with EventLog(log) as writer:
        assert read_start(log) == 5
        assert writer.log("x", {}) == 5
    assert [e["seq"] for e in read_log(log, known_events=None).entries] == [1, 2, 3, 4, 5]
