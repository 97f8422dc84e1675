from __future__ import annotations

import errno
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from substrat.errors import EntryTooLargeError, LogClosedError
from substrat.eventlog import (
    MAX_ENTRY_BYTES,
    MAX_INT,
    MIN_INT,
    PENDING_NAME,
    EventLog,
    encode_entry,
    read_log,
)


def _fill(path: Path, count: int) -> list[int]:
    with EventLog(path, {"session_id": "s"}) as log:
        return [log.log("turn.start", {"prompt": f"p{i}"}) for i in range(count)]


def _prompts(path: Path) -> list[str]:
    return [e["data"]["prompt"] for e in read_log(path).entries]


def test_entries_carry_seq_ts_event_data_and_context(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    assert _fill(path, 3) == [1, 2, 3]
    read = read_log(path)
    assert read.damage.clean
    first = read.entries[0]
    assert first["session_id"] == "s"
    assert first["event"] == "turn.start"
    assert first["data"] == {"prompt": "p0"}
    assert first["ts"].endswith("+00:00")
    # the line on disk is plain JSON that other tools can read
    line = path.read_bytes().splitlines()[0]
    assert json.loads(line)["crc"]


def test_log_returns_after_one_fsync_and_close_removes_the_pending_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    log.log("turn.start", {"prompt": "x"})
    assert len(synced) == 1  # the physical floor: one fsync per acknowledged entry
    assert (tmp_path / PENDING_NAME).read_bytes().startswith(path.read_bytes())  # the copy
    log.close()
    assert not (tmp_path / PENDING_NAME).exists()


@pytest.mark.parametrize(
    "bad",
    [
        {"t": (1, 2)},
        {"u": uuid.uuid4()},
        {1: "int key"},
        {"b": b"bytes"},
        {"f": float("nan")},
        {"s": {1, 2}},
        {"big": MAX_INT + 1},
        {"small": [MIN_INT - 1]},
    ],
)
def test_non_plain_data_raises_type_error_before_writing(tmp_path: Path, bad: Any) -> None:
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        with pytest.raises(TypeError):
            log.log("turn.start", bad)
        assert log.log("turn.start", {"ok": True}) == 1
    assert len(read_log(path).entries) == 1


def test_oversized_entry_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        with pytest.raises(EntryTooLargeError, match="limit"):
            log.log("turn.start", {"prompt": "x" * MAX_ENTRY_BYTES})
    assert path.read_bytes() == b""


def test_closed_log_refuses(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    log.close()
    with pytest.raises(LogClosedError):
        log.log("turn.start", {})


def test_torn_tail_without_pending_is_repaired_before_new_append(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _fill(path, 3)
    whole = path.read_bytes()
    path.write_bytes(whole + whole.splitlines(keepends=True)[0][:25])  # half an entry
    read = read_log(path)
    assert read.damage.counts() == {"torn_tail": 1}
    with EventLog(path) as log:
        assert log.report.truncated_bytes == 25
        assert log.log("turn.start", {"prompt": "new"}) == 4
    after = read_log(path)
    assert after.damage.clean
    assert [e["data"]["prompt"] for e in after.entries] == ["p0", "p1", "p2", "new"]


def test_nul_padded_tail_is_repaired_before_new_append(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _fill(path, 2)
    with open(path, "ab") as handle:
        handle.write(b"\x00" * 4096)
    assert "torn_tail" in read_log(path).damage.counts()
    with EventLog(path) as log:
        assert log.report.truncated_bytes == 4096
        log.log("turn.start", {"prompt": "new"})
    after = read_log(path)
    assert after.damage.clean
    assert _prompts(path) == ["p0", "p1", "new"]


def test_nul_padding_ending_in_newline_is_tail_damage(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _fill(path, 2)
    with open(path, "ab") as handle:
        handle.write(b"\x00" * 100 + b"\n")
    assert read_log(path).damage.counts() == {"nul_bytes": 1}
    with EventLog(path) as log:
        log.log("turn.start", {"prompt": "new"})
    assert _prompts(path) == ["p0", "p1", "new"]
    assert read_log(path).damage.clean


def test_stale_pending_that_is_not_the_last_line_is_not_replayed(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _fill(path, 5)
    second_line = path.read_bytes().splitlines(keepends=True)[1]
    (tmp_path / PENDING_NAME).write_bytes(second_line)
    with EventLog(path) as log:
        assert log.report.pending_discarded == "already_logged"
        assert log.log("turn.start", {"prompt": "new"}) == 6
    assert _prompts(path) == ["p0", "p1", "p2", "p3", "p4", "new"]
    assert not (tmp_path / PENDING_NAME).exists()
    assert read_log(path).damage.clean


def test_pending_equal_to_last_line_is_not_duplicated(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _fill(path, 3)
    last = path.read_bytes().splitlines(keepends=True)[-1]
    (tmp_path / PENDING_NAME).write_bytes(last)
    with EventLog(path) as log:
        assert not log.report.pending_replayed
        assert log.last_seq == 3
    assert _prompts(path) == ["p0", "p1", "p2"]


def test_pending_missing_from_log_is_replayed_once(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _fill(path, 2)
    body = {"seq": 3, "ts": "t", "event": "turn.start", "data": {"prompt": "p2"}}
    line = encode_entry(body)
    (tmp_path / PENDING_NAME).write_bytes(line)
    with open(path, "ab") as handle:  # the append was torn mid-line
        handle.write(line[:30])
    with EventLog(path) as log:
        assert log.report.pending_replayed
        assert log.report.truncated_bytes == 30
        assert log.log("turn.start", {"prompt": "p3"}) == 4
    assert _prompts(path) == ["p0", "p1", "p2", "p3"]
    with EventLog(path) as log:  # a second open changes nothing
        assert not log.report.pending_replayed
    assert _prompts(path) == ["p0", "p1", "p2", "p3"]


def test_torn_pending_is_discarded(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _fill(path, 1)
    (tmp_path / PENDING_NAME).write_bytes(b'{"crc":"00000000","seq":2,"ev')
    with EventLog(path) as log:
        assert log.report.pending_discarded == "torn"
    assert _prompts(path) == ["p0"]


def test_garbage_in_the_middle_costs_only_that_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _fill(path, 4)
    lines = path.read_bytes().splitlines(keepends=True)
    damaged = lines[:2] + [b"this is not json\n", b"\xff\xfe bad utf8\n"] + lines[2:]
    path.write_bytes(b"".join(damaged))
    read = read_log(path)
    assert [e["data"]["prompt"] for e in read.entries] == ["p0", "p1", "p2", "p3"]
    assert read.damage.counts() == {"invalid_json": 1, "invalid_utf8": 1}
    with EventLog(path) as log:
        assert log.report.truncated_bytes == 0  # middle damage is not a tail
        assert log.log("turn.start", {"prompt": "p4"}) == 5
    assert _prompts(path)[-1] == "p4"


def test_flipped_bit_is_caught_by_checksum(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _fill(path, 3)
    raw = bytearray(path.read_bytes())
    index = raw.index(b"p1")
    raw[index + 1] = ord("9")
    path.write_bytes(bytes(raw))
    read = read_log(path)
    assert _prompts(path) == ["p0", "p2"]
    assert read.damage.counts() == {"bad_checksum": 1}


def test_unknown_event_types_are_skipped_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        log.log("turn.start", {"prompt": "a"})
        log.log("hologram.projected", {"from": "the future"})
        log.log("turn.start", {"prompt": "b"})
    read = read_log(path)
    assert [e["data"]["prompt"] for e in read.entries] == ["a", "b"]
    assert [e["event"] for e in read.damage.unknown_events] == ["hologram.projected"]
    # and the writer keeps them: they are valid entries of a newer version
    with EventLog(path) as log:
        assert log.last_seq == 3


def test_missing_log_reads_empty(tmp_path: Path) -> None:
    read = read_log(tmp_path / "nope.jsonl")
    assert read.entries == [] and read.damage.clean


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(MIN_INT, MAX_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_values)
def test_any_plain_json_value_round_trips(tmp_path: Path, value: Any) -> None:
    path = tmp_path / f"rt-{uuid.uuid4().hex}.jsonl"
    with EventLog(path) as log:
        log.log("turn.complete", {"value": value})
    read = read_log(path)
    assert read.damage.clean
    assert read.entries[0]["data"] == {"value": value}


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    count=st.integers(1, 8),
    damage=st.binary(min_size=1, max_size=300),
    cut=st.integers(0, 300),
)
def test_damage_to_last_bytes_loses_only_entries_those_bytes_touch(
    tmp_path: Path, count: int, damage: bytes, cut: int
) -> None:
    path = tmp_path / f"d-{uuid.uuid4().hex}.jsonl"
    _fill(path, count)
    raw = path.read_bytes()
    n = min(len(damage), len(raw))
    start = len(raw) - n
    damaged = raw[:start] + damage[:n]
    damaged = damaged[: max(start, len(damaged) - cut)] if cut < n else damaged
    path.write_bytes(damaged)
    # every entry whose line ends before the damaged region is intact
    ends, offset = [], 0
    for line in raw.splitlines(keepends=True):
        offset += len(line)
        ends.append(offset)
    untouched = sum(1 for end in ends if end <= start)
    read = read_log(path)
    prompts = [e["data"]["prompt"] for e in read.entries]
    assert prompts[:untouched] == [f"p{i}" for i in range(untouched)]
    assert all(p in {f"p{i}" for i in range(count)} for p in prompts)
    with EventLog(path) as log:  # reopening repairs and never fails
        next_seq = log.log("turn.start", {"prompt": "after"})
    final = [e["data"]["prompt"] for e in read_log(path).entries]
    assert final[:untouched] == [f"p{i}" for i in range(untouched)]
    assert final[-1] == "after"
    assert next_seq > untouched


def test_pending_overwritten_in_place_only_first_line_counts(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.log("turn.start", {"prompt": "a long prompt " * 20})
    log.log("turn.start", {"prompt": "short"})
    pending = (tmp_path / PENDING_NAME).read_bytes()
    assert pending.count(b"\n") == 2  # the short line, then the stale end of the long one
    # abandon the log without closing it, as a kill would
    reopened = EventLog(path)
    assert reopened.report.pending_discarded == "already_logged"
    assert not reopened.report.pending_replayed
    assert reopened.log("turn.start", {"prompt": "next"}) == 3
    reopened.close()
    log.close()
    assert [e["data"]["prompt"] for e in read_log(path).entries][1:] == ["short", "next"]


def test_log_pool_reopens_a_log_poisoned_by_a_failed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from substrat.errors import DurabilityError
    from substrat.logs import LogPool
    from substrat.session import SessionStore, new_session_id

    store = SessionStore(tmp_path)
    sid = new_session_id()
    store.create_dir(sid)
    pool = LogPool(store)
    pool.get(sid).log("turn.start", {"prompt": "a"})
    real = os.fsync
    calls = {"n": 0}

    def failing_once(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:  # the append's fsync
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", failing_once)
    with pytest.raises(DurabilityError):
        pool.get(sid).log("turn.start", {"prompt": "b"})
    monkeypatch.undo()
    assert pool.get(sid).log("turn.start", {"prompt": "c"}) >= 2
    pool.close_all()
    prompts = [e["data"]["prompt"] for e in read_log(store.log_path(sid)).entries]
    assert prompts[0] == "a" and prompts[-1] == "c"


def test_failed_append_is_taken_back_even_when_the_first_cleanup_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from substrat.errors import OutcomeUnknownError

    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.log("turn.start", {"prompt": "kept"})
    real = os.fsync
    calls = {"n": 0}

    def failing(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] >= 1:  # the append's fsync and every cleanup fsync fail
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OutcomeUnknownError, match="could not be taken back"):
        log.log("turn.start", {"prompt": "never acknowledged"})
    monkeypatch.undo()
    reopened = EventLog(path)  # same process: the suspect tail is cut back first
    assert reopened.log("turn.start", {"prompt": "next"}) == 2
    reopened.close()
    assert [e["data"]["prompt"] for e in read_log(path).entries] == ["kept", "next"]


def test_a_failed_append_whose_cut_back_failed_is_cut_on_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append's fsync fails and so does the ftruncate that would take it back, so
    the page cache still holds the entry; the next open in this process cuts it
    before anything else, or the entry would count and the next one be numbered
    after it."""
    from substrat.errors import OutcomeUnknownError

    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.log("turn.start", {"prompt": "kept"})

    def eio(*_args: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", eio)
    monkeypatch.setattr(os, "ftruncate", eio)
    with pytest.raises(OutcomeUnknownError):
        log.log("turn.start", {"prompt": "failed"})
    monkeypatch.undo()
    assert b"failed" in path.read_bytes()  # the cache still has it
    with EventLog(path) as reopened:
        assert reopened.log("turn.start", {"prompt": "next"}) == 2
    assert _prompts(path) == ["kept", "next"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EMFILE])
def test_a_failed_append_says_what_fixes_the_host_first_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    from substrat import errors, oserrors
    from substrat.errors import DurabilityError
    from substrat.rpc import protocol

    log = EventLog(tmp_path / "events.jsonl")

    def refused(fd: int) -> None:  # the append's fsync only: taking it back works
        monkeypatch.undo()
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", refused)
    with pytest.raises(DurabilityError) as failed:
        log.log("turn.start", {"prompt": "never acknowledged"})
    hint = oserrors.advice(failed.value)
    assert hint is not None
    said = str(failed.value)
    assert said.startswith(f"{hint}; append of entry 1 to "), said
    assert said.endswith(errors.REOPEN_NOTE) and "\n" not in said  # the library's caller
    # the daemon's answer: the remedy once, still first (with the descriptor budget)
    _, answer, _ = protocol.error_for_exception(failed.value, agents=3)
    full = oserrors.advice(failed.value, agents=3)
    assert full is not None and answer.startswith(f"{full}; append of entry 1"), answer
    assert answer.count("free space") + answer.count("ulimit -n") == 1, answer
    # the operator's: the daemon reopens the log itself; nothing acknowledged was lost
    assert errors.REOPEN_NOTE not in answer and answer.endswith(errors.OPERATOR_NOTE), answer


def test_an_append_to_a_log_whose_directory_was_removed_is_refused(tmp_path: Path) -> None:
    """`rm -rf` of the root under an open log: the write and the fsync still succeed,
    into a file no directory names. The entry can never be read again, so it is refused
    (not acknowledged), and the log cannot be reopened there to write again."""
    import shutil

    from substrat.errors import DurabilityError

    directory = tmp_path / "agent"
    directory.mkdir()
    log = EventLog(directory / "events.jsonl")
    assert log.log("turn.start", {"prompt": "kept"}) == 1
    shutil.rmtree(directory)
    with pytest.raises(DurabilityError) as refused:
        log.log("turn.start", {"prompt": "into a deleted file"})
    assert "was deleted while open" in str(refused.value), refused.value
    assert "it will not appear" in str(refused.value)
    with pytest.raises(OSError):
        EventLog(directory / "events.jsonl")
