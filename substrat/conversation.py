"""A conversation rebuilt from an agent's event log: its completed turns, in order.

The log is the only complete copy of a conversation; providers are restored
from this whenever their own blob is missing or older than the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from substrat import events
from substrat.eventlog import Entry, read_log
from substrat.providers.base import TurnRecord


def conversation_from_log(path: Path) -> list[TurnRecord]:
    """Completed turns, in order, from an agent's log (damage is skipped)."""
    return conversation_from_entries(read_log(path).entries)


def conversation_from_entries(entries: Iterable[Entry]) -> list[TurnRecord]:
    """Completed turns, in order, from a log's healthy entries (as ``read_log`` gives them).

    Every readable ``turn.complete`` is a turn of the conversation; its prompt is
    the one its ``turn.start`` logged, or the copy ``turn.complete`` carries.
    """
    starts: dict[str, str] = {}
    turns: list[TurnRecord] = []
    for entry in entries:
        event, data = entry.get("event"), entry.get("data") or {}
        if event == events.TURN_START:
            starts[str(data.get("turn_id"))] = str(data.get("prompt", ""))
        elif event == events.TURN_COMPLETE:
            turn_id = str(data.get("turn_id"))
            # turn.complete is the commit record: the turn is in the history even when
            # its turn.start line is damaged (the prompt is in both; logs written before
            # turn.complete carried it show an empty prompt, and fsck says so)
            prompt = starts.pop(turn_id, None)
            if prompt is None:
                prompt = str(data.get("prompt", ""))
            turns.append(
                TurnRecord(
                    turn_id,
                    prompt,
                    str(data.get("response", "")),
                    list(data.get("transcript") or []),
                )
            )
    return turns
