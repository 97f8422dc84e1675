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
    """Completed turns, in order, from a log's healthy entries (as ``read_log`` gives them)."""
    starts: dict[str, str] = {}
    turns: list[TurnRecord] = []
    for entry in entries:
        event, data = entry.get("event"), entry.get("data") or {}
        if event == events.TURN_START:
            starts[str(data.get("turn_id"))] = str(data.get("prompt", ""))
        elif event == events.TURN_COMPLETE:
            turn_id = str(data.get("turn_id"))
            if turn_id in starts:
                turns.append(
                    TurnRecord(
                        turn_id,
                        starts.pop(turn_id),
                        str(data.get("response", "")),
                        list(data.get("transcript") or []),
                    )
                )
    return turns
