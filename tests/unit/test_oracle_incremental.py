"""Incremental observation (oracle.incremental) keeps its power: a changed log is read again."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from faultfs import FaultFS
from oracle.errors import OracleViolation
from oracle.harness import CrashHarness, held_interception
from oracle.incremental import FilesMemo, StaleMemo, files_below
from oracle.workload import Step

ROOT = "/incremental-test"


def test_read_tree_maps_every_entry_below_a_directory() -> None:
    fs = FaultFS(ROOT)
    with fs:
        os.makedirs(f"{ROOT}/a/b")
        Path(f"{ROOT}/a/x.log").write_bytes(b"one\n")
        Path(f"{ROOT}/a/b/y.log").write_bytes(b"two\n")
    assert fs.read_tree("a") == {"b": None, "x.log": b"one\n", "b/y.log": b"two\n"}
    assert fs.read_tree("missing") == {}
    with pytest.raises(NotADirectoryError):
        fs.read_tree("a/x.log")


def test_files_below_tells_a_directory_a_file_a_missing_path_and_a_broken_one() -> None:
    import errno

    fs = FaultFS(ROOT)
    with fs:
        os.makedirs(f"{ROOT}/a/b")
        Path(f"{ROOT}/a/x.log").write_bytes(b"one\n")
    assert files_below(fs, f"{ROOT}/a") == {"b": None, "x.log": b"one\n"}
    assert files_below(fs, f"{ROOT}/a/x.log") == {"": b"one\n"}
    assert files_below(fs, f"{ROOT}/a/missing") == {}
    assert files_below(fs, f"{ROOT}/a/x.log/y") == {"": errno.ENOTDIR}


@pytest.mark.parametrize("on_faultfs", [True, False], ids=["faultfs", "real disk"])
def test_a_memo_derives_again_exactly_when_the_bytes_change(
    on_faultfs: bool, tmp_path: Path
) -> None:
    fs = FaultFS(ROOT) if on_faultfs else None
    top = Path(ROOT) if on_faultfs else tmp_path
    log = top / "agent.log"
    memo: FilesMemo[int] = FilesMemo(verify_every=0)
    calls: list[bytes] = []

    def derive() -> int:
        data = fs.read_file("agent.log") if fs is not None else log.read_bytes()
        calls.append(data)
        return data.count(b"\n")

    def write(data: bytes) -> None:
        if fs is None:
            log.write_bytes(data)
            return
        with fs:
            log.write_bytes(data)

    write(b"a\n")
    assert memo.get(fs, log, derive) == 1
    assert memo.get(fs, log, derive) == 1
    assert len(calls) == 1  # unchanged bytes: not derived again
    write(b"a\nb\n")
    assert memo.get(fs, log, derive) == 2
    write(b"a\nc\n")  # same length, other bytes
    assert memo.get(fs, log, derive) == 2
    assert len(calls) == 3
    assert files_below(fs, top / "absent") == {}


def test_a_derivation_that_reads_other_files_is_caught() -> None:
    fs = FaultFS(ROOT)
    with fs:
        os.makedirs(f"{ROOT}/d")
        Path(f"{ROOT}/d/watched").write_bytes(b"x")
        Path(f"{ROOT}/other").write_bytes(b"1")
    memo: FilesMemo[bytes] = FilesMemo(verify_every=2)
    memo.get(fs, f"{ROOT}/d", lambda: fs.read_file("other"))
    with fs:
        Path(f"{ROOT}/other").write_bytes(b"2")
    with pytest.raises(StaleMemo):
        memo.get(fs, f"{ROOT}/d", lambda: fs.read_file("other"))


def _harness_with_turns() -> CrashHarness:
    harness = CrashHarness()
    harness.run(Step("create_root", "ada"))
    harness.run(Step("turn", "ada"))
    harness.check_running()
    harness.run(Step("turn", "ada"))
    harness.check_running()  # the log changed: read again, and it matches
    return harness


def test_the_running_check_sees_a_log_that_changed_behind_the_orchestrator() -> None:
    harness = _harness_with_turns()
    node = next(iter(harness.orch.tree.walk()))
    log = harness.orch.logs.path(node.session_id)
    data = harness.fs.read_file(os.path.relpath(log, harness.fs.root))
    with harness.fs:
        # cut the last turn off the log: the memo must not answer from the old bytes
        lines = data.splitlines(keepends=True)
        cut = max(i for i, line in enumerate(lines) if b'"turn.complete"' in line)
        Path(log).write_bytes(b"".join(lines[:cut]))
    harness._checked = False
    with pytest.raises(OracleViolation, match="conversation"):
        harness.check_running()
    harness.close()


def test_the_running_check_after_a_step_compares_with_the_model() -> None:
    harness = _harness_with_turns()
    # The model now expects a turn the orchestrator never ran.
    harness.run(Step("evict", "ada"))
    agent = next(iter(harness.model.state.agents.values()))
    agent.turns.append(agent.turns[0])
    with pytest.raises(OracleViolation):
        harness.check_running()
    harness.close()


def test_the_running_check_sees_a_sealed_segment_that_changed_behind_the_orchestrator() -> None:
    # A log is its active file and its sealed segments: a memo keyed on the active
    # file alone answered from old bytes when only a segment changed (found by the
    # checkpoint crash fuzzer under the default profile, seed 7).
    from substrat.segments import list_sealed, roll

    harness = _harness_with_turns()
    node = next(iter(harness.orch.tree.walk()))
    log = harness.orch.logs.path(node.session_id)
    entries = harness.fs.read_file(os.path.relpath(log, harness.fs.root)).count(b"\n")
    with harness.fs:
        roll(log, 1, entries)
    harness._checked = False
    harness.check_running()  # the whole history is in the segment now, and it matches
    with harness.fs:
        (segment,) = list_sealed(log)
    data = harness.fs.read_file(os.path.relpath(segment.path, harness.fs.root))
    with harness.fs:
        lines = data.splitlines(keepends=True)
        cut = max(i for i, line in enumerate(lines) if b'"turn.complete"' in line)
        segment.path.write_bytes(b"".join(lines[:cut]))
    harness._checked = False
    with pytest.raises(OracleViolation, match="conversation"):
        harness.check_running()
    harness.close()


def _recovered_and_its_check() -> tuple[CrashHarness, Callable[[], None]]:
    """A harness just crashed and recovered, and a run of the invariants' check on it
    with the harness's memos (as the check after a recovery runs them)."""
    from oracle.checks import Reads, check_invariants

    harness = _harness_with_turns()
    harness.run(Step("turn", "ada"), crash_at=10_000)  # no boundary that far: crash after
    harness.crash_and_recover("power")

    def check() -> None:
        with harness.fs:
            check_invariants(
                harness.orch, harness.model.state, Reads(harness.orch, harness.memos, harness.fs)
            )

    return harness, check


def test_the_recovery_check_sees_a_session_record_that_changed_behind_it() -> None:
    """The store scan of the invariants is kept by the records' bytes: unchanged, it is
    not run again; a record that changes or goes is scanned again and judged."""
    harness, check = _recovered_and_its_check()
    memos, orch, fs = harness.memos, harness.orch, harness.fs
    scans = memos.records.derived
    check()
    assert memos.records.derived == scans  # nothing changed: the scan is not run again
    harness.run(Step("turn", "ada"))  # the session is restored and saved again:
    harness.run(Step("evict", "ada"))  # its record changes
    check()
    assert memos.records.derived == scans + 1
    node = next(iter(orch.tree.walk()))
    with fs:
        os.unlink(orch.store.record_path(node.session_id))
    with pytest.raises(OracleViolation, match="has no session record"):
        check()
    harness.close()


def test_a_log_sealed_into_a_segment_is_read_again() -> None:
    """Found by the crash fuzzer's checkpoint machine on lazyfs: after sealing, a
    log's active file can hold the same bytes as at an earlier check while its
    sealed segments hold more turns. Keyed by the active file alone, the memo gave
    that earlier, shorter conversation ("expected 8 turns, found 5"); the memos
    are keyed by every file of the log's directory now."""
    from oracle.sweep import SMALL_CHECKPOINTS

    with held_interception():
        harness = CrashHarness(profile="lazyfs", checkpoints=SMALL_CHECKPOINTS)
        steps = [
            (Step("create_root", "ada"), None),
            (Step("send", "ada", "ada"), None),
            (Step("broadcast", "ada"), None),
            (Step("send", "ada", "ada"), None),
            (Step("broadcast", "ada"), None),
            (Step("turn", "ada"), None),
            (Step("broadcast", "ada"), 1),
            (Step("broadcast", "ada"), None),
            (Step("send", "ada", "ada"), None),
            (Step("send", "ada", "ada"), 36),
        ]
        for step, crash_at in steps:
            harness.run(step, crash_at=crash_at)
            if crash_at is None:
                harness.check_running()
            else:
                harness.crash_and_recover("process", 0)
        harness.close()


def test_a_log_is_keyed_by_the_files_reading_it_reads() -> None:
    """``log_part``: the session record and the pending copy beside a log change on
    steps that leave the log alone; the log's own files (active, segments, start
    record, base) all count."""
    from oracle.incremental import log_part

    files = {
        "": None,
        "session.json": b"{}",
        "session.json.tmp": b"{",
        "events.pending": b"x",
        "events.jsonl": b"a\n",
        "events.00000000000000000001-00000000000000000004.jsonl.gz": b"z",
        "events.start": b"s\n",
        "events.base": b"b\n",
    }
    assert log_part(files) == {
        "": None,
        "events.jsonl": b"a\n",
        "events.00000000000000000001-00000000000000000004.jsonl.gz": b"z",
        "events.start": b"s\n",
        "events.base": b"b\n",
    }


def test_the_running_check_reads_a_log_again_only_when_the_log_changed() -> None:
    """A session record or a pending copy that changed (as a suspension or an append
    changes them) is not a change of the log: the conversation is not derived again.
    A start record that changes behind the orchestrator is: it is read again."""
    harness = _harness_with_turns()
    node = next(iter(harness.orch.tree.walk()))
    log = Path(harness.orch.logs.path(node.session_id))
    derived = harness.memos.turns.derived
    with harness.fs:
        record = harness.orch.store.record_path(node.session_id)
        record.write_bytes(record.read_bytes() + b" ")
        log.with_name("events.pending").write_bytes(b"another pending copy\n")
    harness._checked = False
    harness.check_running()
    assert harness.memos.turns.derived == derived
    with harness.fs:
        log.with_name("events.start").write_bytes(b"not a start record\n")
    harness._checked = False
    harness.check_running()  # an unreadable start record: the log is read from entry 1
    assert harness.memos.turns.derived == derived + 1
    harness.close()


def test_the_recovery_check_reads_a_start_record_or_base_again_when_it_changes() -> None:
    """The start record and the base are files of the log's directory: the check keeps
    what it made of them by the log's files, so an unchanged log is not read for them
    again, and one written (or damaged) behind it is read again and judged."""
    from substrat.logbase import base_path
    from substrat.segments import start_path, write_start

    harness, check = _recovered_and_its_check()
    memos, orch, fs = harness.memos, harness.orch, harness.fs
    check()
    starts, bases = memos.starts.derived, memos.bases.derived
    check()
    assert (memos.starts.derived, memos.bases.derived) == (starts, bases)  # nothing changed
    node = next(iter(orch.tree.walk()))
    log = orch.logs.path(node.session_id)
    with fs:
        write_start(log, 99)  # ahead of the log's first entry: claims entries lost
    with pytest.raises(OracleViolation, match="start record says the active file starts"):
        check()
    with fs:
        os.unlink(start_path(log))
        base_path(log).write_bytes(b"not a base\n")
    with pytest.raises(OracleViolation, match="base does not read"):
        check()
    harness.close()
