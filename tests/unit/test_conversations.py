"""The lifecycle fuzzer's conversation check from appended lines (oracle.conversations).

A log that only grew (or is met for the first time) is derived from its new
lines; anything else (an old
entry rewritten in place, a line gone from the middle, a new file beside the
log, a damaged line) goes back to the full rebuild, and the full rebuild is held
to the same turns as the incremental one.
"""

from __future__ import annotations

from typing import Any

import pytest

from oracle.conversations import ACTIVE, Conversations
from substrat import events
from substrat.conversation import conversation_from_entries
from substrat.logline import decode_line, encode_entry
from substrat.providers.base import TurnRecord
from substrat.providers.scripted import chain_digest, reply_header

KEY = "/root/agents/s1"


def turn_lines(first_seq: int, number: int, digest: str, prompt: str) -> tuple[bytes, str]:
    """A turn's two entries (start, complete) and the digest after it."""
    digest = chain_digest(digest, prompt)
    turn_id = f"t{number}"
    start = {
        "seq": first_seq,
        "event": events.TURN_START,
        "data": {"turn_id": turn_id, "prompt": prompt},
    }
    complete = {
        "seq": first_seq + 1,
        "event": events.TURN_COMPLETE,
        "data": {"turn_id": turn_id, "response": reply_header(number, digest) + "\nok"},
    }
    return encode_entry(start) + encode_entry(complete), digest


def log_of(turns: int, prompts: str = "p") -> bytes:
    data, digest = b"", ""
    for number in range(1, turns + 1):
        lines, digest = turn_lines(2 * number - 1, number, digest, f"{prompts}{number}")
        data += lines
    return data


class History:
    """What ``Orchestrator.history`` would rebuild from the current bytes, counted."""

    def __init__(self) -> None:
        self.data = b""
        self.calls = 0

    def __call__(self) -> list[TurnRecord]:
        self.calls += 1
        lines = (decode_line(line) for line in self.data.splitlines())
        return conversation_from_entries(e for e in lines if not isinstance(e, str))

    def files(self) -> dict[str, Any]:
        return {ACTIVE: self.data}


def test_an_appended_turn_is_derived_from_the_new_lines_alone() -> None:
    history, memo = History(), Conversations(full_every=0)
    history.data = log_of(1)
    assert memo.count(KEY, history.files(), history) == 1
    assert history.calls == 0  # a log met first is taken as grown from nothing
    history.data = log_of(3)
    assert memo.count(KEY, history.files(), history) == 3
    assert history.calls == 0 and memo.appended == 2


def test_a_log_met_first_is_checked_from_its_bytes() -> None:
    """The first lookup derives from the bytes alone, and still checks every turn's
    place in the chain: a broken chain fails there, with no full rebuild."""
    history, memo = History(), Conversations(full_every=0)
    lines = log_of(2).splitlines(keepends=True)
    other = log_of(2, prompts="q").splitlines(keepends=True)
    history.data = b"".join(lines[:2] + other[2:])  # turn 2 answers another chain
    with pytest.raises(AssertionError):
        memo.count(KEY, history.files(), history)
    assert history.calls == 0


@pytest.mark.parametrize("first", ["a damaged line", "a file beside the log"])
def test_a_log_met_first_that_is_no_clean_append_is_rebuilt_in_full(first: str) -> None:
    history, memo = History(), Conversations(full_every=0)
    history.data = log_of(2)
    files: dict[str, Any] = history.files()
    if first == "a damaged line":
        history.data = log_of(2) + b'{"crc":"00000000","seq":5}\n'
        files = history.files()
    else:
        files = {**files, "events.start": b"{}"}
    assert memo.count(KEY, files, history) == 2
    assert history.calls == 1 and memo.appended == 0


@pytest.mark.parametrize(
    "change",
    [
        "an old entry rewritten in place",
        "a line dropped from the middle",
        "a file beside the log",
        "a damaged appended line",
    ],
)
def test_anything_but_an_append_is_rebuilt_in_full(change: str) -> None:
    history, memo = History(), Conversations(full_every=0)
    history.data = log_of(2)
    memo.count(KEY, history.files(), history)
    assert history.calls == 0
    files: dict[str, Any]
    if change == "an old entry rewritten in place":
        # the same length, another prompt: turn 1's response no longer answers it
        first = {"seq": 1, "event": events.TURN_START, "data": {"turn_id": "t1", "prompt": "q1"}}
        old = log_of(3)
        cut = old.index(b"\n") + 1
        history.data = encode_entry(first) + old[cut:]
        assert len(history.data) == len(old)
        files = history.files()
    elif change == "a line dropped from the middle":
        lines = log_of(3).splitlines(keepends=True)
        history.data = b"".join(lines[:1] + lines[2:])
        files = history.files()
    elif change == "a file beside the log":
        history.data = log_of(3)
        files = {**history.files(), "events.start": b"{}"}
    else:
        history.data = log_of(2) + b'{"crc":"00000000","seq":5}\n'
        files = history.files()
    if change in ("an old entry rewritten in place", "a line dropped from the middle"):
        with pytest.raises(AssertionError):  # the chain is broken: the full rebuild says so
            memo.count(KEY, files, history)
    else:
        memo.count(KEY, files, history)
    assert history.calls == 1 and memo.appended == 1  # the first lookup's alone


def test_a_full_rebuild_that_disagrees_with_the_decoded_bytes_fails() -> None:
    history, memo = History(), Conversations(full_every=0)
    history.data = log_of(3)

    def drops_a_turn() -> list[TurnRecord]:
        turns = history()
        return turns[:1] + turns[2:]

    memo.count(KEY, history.files(), drops_a_turn)  # from the bytes: not asked
    with pytest.raises(AssertionError, match="differs from what Orchestrator"):
        memo.count(KEY, history.files(), drops_a_turn, force_full=True)


def test_every_nth_lookup_and_a_forced_one_rebuild_in_full() -> None:
    history, memo = History(), Conversations(full_every=3)
    history.data = log_of(1)
    for _ in range(6):
        memo.count(KEY, history.files(), history)
    assert history.calls == 2  # the third and the sixth
    memo.count(KEY, history.files(), history, force_full=True)
    assert history.calls == 3
