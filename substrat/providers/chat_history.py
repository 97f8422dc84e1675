"""Chat-completions message lists: rebuilt from the log, repaired before a send.

A bare-LLM conversation has no copy anywhere but the event log. Each completed
turn logs the messages it added (its transcript), so the conversation is the
system message followed by every transcript in order. These functions are pure
so the provider, the oracle and the tests all agree on what "the conversation
the log describes" is.

Endpoints reject a history in which an assistant ``tool_calls`` entry has no
matching ``tool`` result right after it, or a ``tool`` result answers no call.
An abort or a crash in the middle of a tool round is the usual way to get
there, so :func:`repair_orphans` runs before every request.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from substrat.providers.base import TurnRecord

Message = dict[str, Any]

ORPHAN_RESULT_TEXT = (
    "[no result: this tool call was interrupted (an abort or a crash) before it "
    "returned; it may or may not have taken effect]"
)


@dataclass(frozen=True)
class Repair:
    """What :func:`repair_orphans` changed: call ids answered with a placeholder,
    and tool results dropped because no call in place asked for them."""

    synthesized: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.synthesized or self.dropped)

    def to_dict(self) -> dict[str, Any]:
        return {"synthesized": list(self.synthesized), "dropped": list(self.dropped)}


def turn_messages(turn: TurnRecord) -> list[Message]:
    """The messages one logged turn contributed.

    A turn logged without a transcript (an older version, another provider)
    still counts as a user prompt and an assistant answer.
    """
    if turn.transcript:
        return [dict(m) for m in turn.transcript]
    return [
        {"role": "user", "content": turn.prompt},
        {"role": "assistant", "content": turn.response},
    ]


def rebuild(system_prompt: str, history: Iterable[TurnRecord]) -> list[Message]:
    """The message list the log describes: system message, then every turn's messages."""
    messages: list[Message] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    for turn in history:
        messages.extend(turn_messages(turn))
    return messages


def _call_ids(message: Message) -> list[str]:
    calls = message.get("tool_calls") or []
    ids = [str(c.get("id", "")) for c in calls if isinstance(c, dict)]
    return list(dict.fromkeys(ids))  # a duplicated id needs one answer


def repair_orphans(messages: list[Message]) -> tuple[list[Message], Repair]:
    """A copy of ``messages`` every endpoint accepts, and what had to change.

    Each assistant message with tool calls is followed by exactly one result per
    call: missing ones get :data:`ORPHAN_RESULT_TEXT`, stray or duplicate
    results (no call right before them asks for them) are dropped.
    """
    out: list[Message] = []
    synthesized: list[str] = []
    dropped: list[str] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        role = message.get("role")
        if role == "tool":
            dropped.append(str(message.get("tool_call_id", "")))
            index += 1
            continue
        out.append(message)
        index += 1
        if role != "assistant" or not message.get("tool_calls"):
            continue
        wanted = _call_ids(message)
        answered: set[str] = set()
        while index < len(messages) and messages[index].get("role") == "tool":
            result = messages[index]
            call_id = str(result.get("tool_call_id", ""))
            if call_id in wanted and call_id not in answered:
                out.append(result)
                answered.add(call_id)
            else:
                dropped.append(call_id)
            index += 1
        for call_id in wanted:
            if call_id not in answered:
                out.append({"role": "tool", "tool_call_id": call_id, "content": ORPHAN_RESULT_TEXT})
                synthesized.append(call_id)
    repair = Repair(synthesized, dropped)
    assert not find_orphans(out), "repair left an orphan tool call"
    return out, repair


def find_orphans(messages: list[Message]) -> list[str]:
    """Descriptions of every tool-call/result mismatch; empty when the list is valid."""
    problems: list[str] = []
    pending: list[str] = []  # calls of the last assistant message still unanswered
    for position, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = str(message.get("tool_call_id", ""))
            if call_id in pending:
                pending.remove(call_id)
            else:
                problems.append(f"message {position}: tool result {call_id!r} answers no open call")
            continue
        if pending:
            problems.append(f"message {position}: tool calls {pending} have no result")
        pending = _call_ids(message) if role == "assistant" else []
    if pending:
        problems.append(f"end of conversation: tool calls {pending} have no result")
    return problems


def turn_problems(turn: TurnRecord) -> list[str]:
    """Ways a logged chat turn contradicts itself; empty when it is consistent.

    A transcript starts with the prompt as a user message, holds no other user
    message, ends with an assistant message without tool calls (or with the
    results of the calls it made), and its assistant texts, joined by newlines,
    are the logged response.
    """
    where = f"turn {turn.turn_id}"
    if not turn.transcript:
        return []  # logged without a transcript: nothing more to check
    problems: list[str] = []
    first = turn.transcript[0]
    if first.get("role") != "user" or first.get("content") != turn.prompt:
        problems.append(f"{where}: the transcript does not start with the prompt")
    if any(m.get("role") == "user" for m in turn.transcript[1:]):
        problems.append(f"{where}: a second user message inside one turn")
    texts = [
        str(m["content"])
        for m in turn.transcript
        if m.get("role") == "assistant" and m.get("content")
    ]
    if "\n".join(texts) != turn.response:
        problems.append(f"{where}: the response is not the transcript's assistant text")
    problems.extend(f"{where}: {p}" for p in find_orphans(turn.transcript))
    return problems


def conversation_problems(system_prompt: str, history: Iterable[TurnRecord]) -> list[str]:
    """Everything wrong with the conversation a log describes (for checkers and fsck)."""
    turns = list(history)
    problems = [p for turn in turns for p in turn_problems(turn)]
    problems.extend(find_orphans(rebuild(system_prompt, turns)))
    return problems
