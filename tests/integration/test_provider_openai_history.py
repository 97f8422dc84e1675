"""Rebuilding and repairing chat histories, checked against the loopback server's validator."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from substrat.providers.base import TurnRecord
from substrat.providers.chat_history import (
    ORPHAN_RESULT_TEXT,
    conversation_problems,
    find_orphans,
    rebuild,
    repair_orphans,
)
from tests.support.chat_server import conversation_problem


def call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "echo", "arguments": "{}"}}


def valid(messages: list[dict[str, Any]]) -> bool:
    return conversation_problem({"model": "m", "messages": messages}) is None


def test_rebuild_is_the_system_prompt_then_every_transcript() -> None:
    t1 = TurnRecord(
        "t1",
        "a",
        "b",
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
    )
    t2 = TurnRecord("t2", "c", "d")  # logged without a transcript
    assert rebuild("sys", [t1, t2]) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    assert rebuild("", []) == []


def test_repair_answers_missing_calls_and_drops_stray_results() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "tool", "tool_call_id": "zzz", "content": "stray"},
        {"role": "tool", "tool_call_id": "b", "content": "duplicate"},
        {"role": "user", "content": "next"},
        {"role": "tool", "tool_call_id": "a", "content": "late"},
    ]
    assert not valid(messages)
    repaired, repair = repair_orphans(messages)
    assert valid(repaired)
    assert repair.synthesized == ["a"]
    assert repair.dropped == ["zzz", "b", "a"]
    assert repaired[2] == {"role": "tool", "tool_call_id": "b", "content": "B"}
    assert repaired[3] == {"role": "tool", "tool_call_id": "a", "content": ORPHAN_RESULT_TEXT}
    assert find_orphans(repaired) == []


def test_a_valid_history_is_left_alone() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "ok", "tool_calls": [call("a")]},
        {"role": "tool", "tool_call_id": "a", "content": "A"},
        {"role": "assistant", "content": "done"},
    ]
    repaired, repair = repair_orphans(messages)
    assert repaired == messages and not repair


def test_a_conversation_ending_in_an_open_call_is_repaired() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call("a")]},
    ]
    assert find_orphans(messages) and not valid(messages)
    repaired, repair = repair_orphans(messages)
    assert valid(repaired) and repair.synthesized == ["a"]


@st.composite
def damaged_conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Valid turns with tool rounds, then cut, shuffled a little and sprinkled with strays."""
    messages: list[dict[str, Any]] = []
    counter = 0
    for _ in range(draw(st.integers(0, 4))):
        messages.append({"role": "user", "content": "u"})
        for _ in range(draw(st.integers(0, 3))):
            ids = []
            for _ in range(draw(st.integers(1, 3))):
                counter += 1
                ids.append(f"c{counter}")
            messages.append(
                {"role": "assistant", "content": None, "tool_calls": [call(i) for i in ids]}
            )
            messages.extend({"role": "tool", "tool_call_id": i, "content": "r"} for i in ids)
        messages.append({"role": "assistant", "content": "a"})
    # Damage: delete some messages (a cut anywhere), add stray results.
    for _ in range(draw(st.integers(0, 3))):
        if messages:
            del messages[draw(st.integers(0, len(messages) - 1))]
    for _ in range(draw(st.integers(0, 2))):
        position = draw(st.integers(0, len(messages)))
        stray = draw(st.sampled_from(["nope", "c1", "c2"]))
        messages.insert(position, {"role": "tool", "tool_call_id": stray, "content": "s"})
    if draw(st.booleans()):
        messages = messages[: draw(st.integers(0, len(messages)))]
    return messages


@settings(max_examples=300, deadline=None)
@given(damaged_conversations())
def test_any_damaged_history_repairs_to_one_the_server_accepts(
    messages: list[dict[str, Any]],
) -> None:
    repaired, repair = repair_orphans(messages)
    with_prompt = [*repaired, {"role": "user", "content": "next"}]
    assert valid(with_prompt), conversation_problem({"model": "m", "messages": with_prompt})
    assert bool(repair) == (not valid([*messages, {"role": "user", "content": "next"}]))
    again, second = repair_orphans(repaired)
    assert again == repaired and not second  # repair is idempotent
    # Nothing but tool results is ever removed, and nothing else is added.
    assert [m for m in repaired if m["role"] != "tool"] == [
        m for m in messages if m["role"] != "tool"
    ]


def test_conversation_problems_spots_inconsistent_turns() -> None:
    good = TurnRecord(
        "t1",
        "go",
        "working\ndone",
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "working", "tool_calls": [call("a")]},
            {"role": "tool", "tool_call_id": "a", "content": "A"},
            {"role": "assistant", "content": "done"},
        ],
    )
    assert conversation_problems("sys", [good]) == []
    wrong_response = TurnRecord("t2", "go", "something else", good.transcript)
    wrong_prompt = TurnRecord("t3", "other", good.response, good.transcript)
    cut = TurnRecord("t4", "go", "working", good.transcript[:2])
    assert "response" in conversation_problems("", [wrong_response])[0]
    assert "prompt" in conversation_problems("", [wrong_prompt])[0]
    assert any("no result" in p for p in conversation_problems("", [cut]))
