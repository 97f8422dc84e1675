"""Recovery's read of a whole log builds its conversation (substrat.recovery_logs), the same
one ``conversation_from_log`` gives of the log that read repaired, whatever the log holds:
turns whole or cut, damaged lines, duplicate seqs, unknown events, a torn tail, a pending
entry to replay or to drop.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from substrat import events
from substrat.conversation import ConversationBuilder, conversation_from_log
from substrat.eventlog import PENDING_NAME, repair_log
from substrat.facts import AgentFacts
from substrat.logline import encode_entry
from substrat.recovery_logs import _feeding

EVENTS = (
    events.TURN_START,
    events.TURN_COMPLETE,
    events.TURN_FAILED,
    events.MESSAGE_ENQUEUED,
    "no.such.event",
)


@st.composite
def logs(draw: Any) -> tuple[bytes, bytes | None]:
    """A log's bytes (entries, some damaged, maybe a torn tail) and a pending copy or None."""
    out = b""
    seq = 0
    lines: list[bytes] = []
    for _ in range(draw(st.integers(0, 14))):
        seq += draw(st.sampled_from([1, 1, 1, 0, 2]))  # 0: a duplicate seq, 2: a gap
        data: dict[str, Any] = {"turn_id": f"t{draw(st.integers(1, 4))}"}
        if draw(st.booleans()):
            data["prompt"] = draw(st.sampled_from(["p", "q", ""]))
        if draw(st.booleans()):
            data["response"] = draw(st.sampled_from(["r", "s"]))
        if draw(st.booleans()):
            data["transcript"] = [{"role": "user", "content": "x"}]
        body = {"seq": seq, "event": draw(st.sampled_from(EVENTS)), "data": data}
        line = encode_entry(body)
        damage = draw(st.sampled_from(["none", "none", "none", "flip", "cut"]))
        if damage == "flip":  # a checksum that no longer holds
            line = line[:20] + bytes([line[20] ^ 1]) + line[21:]
        elif damage == "cut":
            line = line[: len(line) // 2] + b"\n"
        lines.append(line)
    out = b"".join(lines)
    if lines and draw(st.booleans()):  # a torn tail: the last append half written
        out += encode_entry({"seq": seq + 1, "event": events.TURN_COMPLETE, "data": {}})[:9]
    pending = None
    if draw(st.booleans()):  # the last append's pending copy: in the log already, or not
        entry = {"seq": seq + draw(st.integers(0, 1)), "event": events.TURN_COMPLETE}
        entry["data"] = {"turn_id": "t9", "prompt": "late", "response": "r"}
        pending = encode_entry(entry)
    return out, pending


@settings(max_examples=150, deadline=None)
@given(logs())
def test_recoverys_conversation_is_the_one_read_from_the_repaired_log(
    log: tuple[bytes, bytes | None],
) -> None:
    data, pending = log
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "events.jsonl"
        path.write_bytes(data)
        if pending is not None:
            (path.parent / PENDING_NAME).write_bytes(pending)
        built = ConversationBuilder()
        facts = AgentFacts("s1")
        repair_log(path, _feeding(facts.add_all, built.add_all))
        assert built.turns == conversation_from_log(path)
        assert os.path.getsize(path) <= len(data) + len(pending or b"")


def test_the_builder_fed_in_batches_is_conversation_from_entries() -> None:
    entries = [
        {"seq": 1, "event": events.TURN_START, "data": {"turn_id": "t1", "prompt": "a"}},
        {"seq": 2, "event": events.TURN_COMPLETE, "data": {"turn_id": "t1", "response": "b"}},
        {"seq": 3, "event": events.TURN_START, "data": {"turn_id": "t2", "prompt": "c"}},
        {"seq": 4, "event": events.TURN_COMPLETE, "data": {"turn_id": "t2", "response": "d"}},
    ]
    built = ConversationBuilder()
    built.add_all(entries[:3])  # a turn whose start and commit come in two batches
    built.add_all(entries[3:])
    assert [(t.turn_id, t.prompt, t.response) for t in built.turns] == [
        ("t1", "a", "b"),
        ("t2", "c", "d"),
    ]
