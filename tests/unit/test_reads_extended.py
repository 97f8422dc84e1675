"""The check's read of a log that only grew, from its read before (oracle.reads.extended_read):
whenever it gives a read, that read is ``read_log``'s of the log now; it gives one for
healthy appended lines and none for anything else. And FilesMemo's use of it: counted,
and checked against a fresh derivation every ``verify_every``-th time.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.incremental import FilesMemo, StaleMemo
from oracle.reads import extended_read
from substrat import events
from substrat.eventlog import LOG_NAME, LogRead, read_log
from substrat.logline import encode_entry


def line(seq: int, event: str = events.MESSAGE_ENQUEUED) -> bytes:
    return encode_entry({"seq": seq, "event": event, "data": {"n": seq}})


def read_of(data: bytes) -> LogRead:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / LOG_NAME
        path.write_bytes(data)
        return read_log(path)


SUFFIXES = {
    "healthy": lambda n: line(n + 1) + line(n + 2),
    "torn": lambda n: line(n + 1) + line(n + 2)[:10],
    "damaged": lambda n: line(n + 1)[:12] + b"x" + line(n + 1)[13:],
    "repeated seq": lambda n: line(n),
    "skipped seq": lambda n: line(n + 2),
    "unknown event": lambda n: line(n + 1, "no.such.event"),
    "empty line": lambda n: b"\n",
}


@settings(max_examples=60, deadline=None)
@given(
    before=st.integers(1, 6),
    kinds=st.lists(st.sampled_from(sorted(SUFFIXES)), min_size=1, max_size=3),
    old_damage=st.booleans(),
)
def test_an_extended_read_is_read_logs(before: int, kinds: list[str], old_damage: bool) -> None:
    old = b"".join(line(seq) for seq in range(1, before + 1))
    if old_damage:  # a log whose read of then skipped a line: always read whole
        old += b"garbage\n"
    new = old
    top = before
    for kind in kinds:
        new += SUFFIXES[kind](top)
        top += 2 if kind in ("healthy", "torn") else 1
    then = read_of(old)
    got = extended_read(then, {LOG_NAME: old}, {LOG_NAME: new})
    if got is not None:
        assert got == read_of(new)
    healthy = set(kinds) == {"healthy"} and not old_damage
    assert (got is not None) is healthy


def test_a_change_beside_the_active_file_is_read_whole() -> None:
    old = line(1)
    new = old + line(2)
    then = read_of(old)
    seg = "events.0000000001-0000000001.jsonl"
    assert extended_read(then, {LOG_NAME: old}, {LOG_NAME: new}) is not None
    assert extended_read(then, {LOG_NAME: old}, {LOG_NAME: new, seg: b""}) is None
    assert extended_read(then, {LOG_NAME: old, seg: b"a"}, {LOG_NAME: new, seg: b"b"}) is None
    assert extended_read(then, {LOG_NAME: old}, {LOG_NAME: line(2) + line(3)}) is None


def test_the_memo_extends_and_checks_its_extensions() -> None:
    memo: FilesMemo[int] = FilesMemo(verify_every=2)
    derived: list[int] = []

    def derive(value: int) -> Any:
        return lambda: derived.append(value) or value

    def extend(then: int, files_then: dict[str, Any], files_now: dict[str, Any]) -> int:
        return then + 1

    assert memo.get(None, "/k", derive(1), {"a": b"1"}, extend) == 1  # nothing to extend
    assert memo.get(None, "/k", derive(2), {"a": b"12"}, extend) == 2  # extended
    assert (memo.derived, memo.extended, derived) == (1, 1, [1])
    # the second extension is checked: a fresh derivation says 9, the extension 3
    with pytest.raises(StaleMemo, match="extension is wrong"):
        memo.get(None, "/k", derive(9), {"a": b"123"}, extend)
