"""A conversation rebuilt from an agent's event log: its completed turns, in order.

The log is the only complete copy of a conversation; providers are restored
from this whenever their own blob is missing or older than the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from substrat import events
from substrat.errors import SubstratError
from substrat.eventlog import Entry, read_log
from substrat.logbase import BASE_NAME, BaseUnreadable, LogBase, read_base
from substrat.providers.base import TurnRecord
from substrat.segments import Segment, active_start, list_log


class ConversationGone(SubstratError):
    """The log's first entries were deleted and its base, which held their turns, does
    not read: the conversation cannot be rebuilt (never guessed from what is left)."""


def conversation_from_log(path: Path) -> list[TurnRecord]:
    """Completed turns, in order, from an agent's log (damage is skipped).

    A log whose first segments the ``delete`` compaction policy removed starts
    with the turns its base holds (:mod:`substrat.logbase`); ConversationGone if
    they are gone and the base does not read.
    """
    # One listing of the log's directory says whether there is a base or a start
    # record to read (most logs have neither) and which segments the read takes.
    return conversation_and_gaps(path)[0]


def conversation_and_gaps(path: Path) -> tuple[list[TurnRecord], list[tuple[int, int]]]:
    """:func:`conversation_from_log`, and the ``seq`` ranges of entries missing from the
    log (segments or lines removed: lost, so readers can say turns may be missing)."""
    turns, gaps, _ = history_of_log(path)
    return turns, gaps


def history_of_log(path: Path) -> tuple[list[TurnRecord], list[tuple[int, int]], int]:
    """:func:`conversation_and_gaps`, and through which entry the compaction policy
    deleted the log (0: none; :func:`~substrat.logbase.deleted_through`), from one
    listing of its directory and one read of its base."""
    listed = list_log(path)
    base = log_base(path, listed)
    read = read_log(path, sealed=listed[0])
    deleted = 0
    if base is not None:  # a base written before a deletion that did not happen: none
        sealed, names = listed
        first = sealed[0].first if sealed else active_start(path, sealed, names)
        deleted = base.deleted_through if first > 1 else 0
    return conversation_with_base(base, read.entries), read.damage.gaps(), deleted


def log_base(
    path: Path, listed: tuple[list[Segment], frozenset[str]] | None = None
) -> LogBase | None:
    """The log's base, if it has one that counts; ConversationGone if its first
    entries are gone and no base that reads says what they held. ``listed``: the
    log's directory as :func:`~substrat.segments.list_log` gave it just now."""
    try:
        base = read_base(path) if listed is None or BASE_NAME in listed[1] else None
        why = "it has no base"
    except BaseUnreadable as exc:
        base, why = None, f"their base does not read ({exc})"
    if base is not None:
        return base
    if listed is None:
        listed = list_log(path)
    sealed, names = listed
    first = sealed[0].first if sealed else active_start(path, sealed, names)
    if first > 1:
        raise ConversationGone(
            f"{path}: entries before {first} are gone and {why}; restore "
            f"{path.parent} from a backup"
        )
    return None  # nothing is deleted, the log holds every turn


def conversation_with_base(base: LogBase | None, entries: Iterable[Entry]) -> list[TurnRecord]:
    """The base's turns, then those of the log's entries after what it deleted."""
    if base is None:
        return conversation_from_entries(entries)
    floor = base.deleted_through
    return [*base.turns, *conversation_from_entries(e for e in entries if e["seq"] > floor)]


def conversation_from_entries(entries: Iterable[Entry]) -> list[TurnRecord]:
    """Completed turns, in order, from a log's healthy entries (as ``read_log`` gives them).

    Every readable ``turn.complete`` is a turn of the conversation; its prompt is
    the one its ``turn.start`` logged, or the copy ``turn.complete`` carries.
    """
    built = ConversationBuilder()
    built.add_all(entries)
    return built.turns


class ConversationBuilder:
    """:func:`conversation_from_entries`, fed a log's entries in batches, in file order:
    recovery's one read of a log builds the conversation its first turn is restored
    from (see :meth:`~substrat.logs.LogPool.keep_conversation`)."""

    __slots__ = ("starts", "turns")

    def __init__(self) -> None:
        self.starts: dict[str, str] = {}
        """Turn id -> the prompt its ``turn.start`` logged, until its ``turn.complete``."""
        self.turns: list[TurnRecord] = []

    def add_all(self, entries: Iterable[Entry]) -> None:
        starts, turns = self.starts, self.turns
        for entry in entries:
            event = entry.get("event")
            if event == events.TURN_START:
                data = entry.get("data") or {}
                starts[str(data.get("turn_id"))] = str(data.get("prompt", ""))
            elif event == events.TURN_COMPLETE:
                data = entry.get("data") or {}
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
