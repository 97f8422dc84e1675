"""A log's base: what its deleted first segments held, written before ``delete`` removes them.

Under the ``delete`` compaction policy (:mod:`substrat.checkpointer`) the
sealed segments a durable checkpoint wholly covers are removed. Two readers
still need what they held: recovery (the agent's state up to the checkpoint)
and the conversation a provider is restored from (every completed turn, see
:mod:`substrat.conversation`). So, before any segment goes, the log's **base**
is written next to it, ``events.base`` in the log's directory, atomically
(:func:`substrat.persistence.atomic_write`)::

    deleted_through   entries 1..N may be gone (they were, or are about to be)
    checkpoint        the durable checkpoint covering them (its entry is in a
                      segment that is kept, so it is checked like any other)
    turns             the conversation's turns completed in entries 1..N

It is one checksummed line in the log format (event ``log.base``, see
docs/events.md). A later deletion rewrites it, carrying the turns on. A crash
after the base is written and before the segments are removed leaves both:
readers take entries 1..N from the base and skip them in the log.

**What may be deleted** (:func:`deletable`): a sealed segment that ends before
the file holding the covering checkpoint's entry starts, and never the newest
sealed segment (its name says where the active file's numbering goes on).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from substrat import events, persistence
from substrat.checkpoints import Checkpoint
from substrat.eventlog import Clock, encode_entry, utc_now_iso
from substrat.facts import AgentFacts
from substrat.facts import read_facts as read_whole_log
from substrat.logline import RecordUnreadable, read_record
from substrat.logread import DamageReport, Entry, iter_log, segment_entries
from substrat.providers.base import TurnRecord
from substrat.segments import ARCHIVE_SUFFIX, Segment, active_start, list_sealed, sibling_path

BASE_NAME = "events.base"
FORMAT = 1


class BaseUnreadable(ValueError):
    """The base file is there but does not read (damaged): what it held is lost."""


@dataclass
class LogBase:
    """What a log's deleted prefix held (see the module docstring)."""

    deleted_through: int
    checkpoint: Checkpoint
    turns: list[TurnRecord]

    def data(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "deleted_through": self.deleted_through,
            "checkpoint": self.checkpoint.data(),
            "turns": [
                {
                    "turn_id": t.turn_id,
                    "prompt": t.prompt,
                    "response": t.response,
                    "transcript": t.transcript,
                }
                for t in self.turns
            ],
        }

    @classmethod
    def from_data(cls, data: Any) -> LogBase:
        if type(data) is not dict or data.get("format") != FORMAT:
            raise BaseUnreadable("not a log base of a format this version reads")
        try:
            deleted = int(data["deleted_through"])
            checkpoint = Checkpoint.from_data(data["checkpoint"])
            turns = [
                TurnRecord(
                    str(t["turn_id"]),
                    str(t["prompt"]),
                    str(t["response"]),
                    list(t.get("transcript") or []),
                )
                for t in data["turns"]
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise BaseUnreadable(f"log base fields: {exc!r}") from None
        if deleted < 1 or checkpoint.at.seq <= deleted:
            raise BaseUnreadable(
                f"log base deletes through {deleted}, its checkpoint ends at {checkpoint.at.seq}"
            )
        return cls(deleted, checkpoint, turns)


def base_path(log_path: str | os.PathLike[str]) -> Path:
    return sibling_path(log_path, BASE_NAME)


def read_base(log_path: str | os.PathLike[str]) -> LogBase | None:
    """The log's base; None if it has none, BaseUnreadable if it is damaged."""
    try:
        entry = read_record(base_path(log_path), events.LOG_BASE)
    except RecordUnreadable as exc:
        raise BaseUnreadable(str(exc)) from None
    if entry is None:
        return None
    return LogBase.from_data(entry.get("data"))


def write_base(log_path: str | os.PathLike[str], base: LogBase, clock: Clock = utc_now_iso) -> None:
    """Write the log's base durably (atomically: the old one or the new one, never half);
    its ``ts`` is ``clock()`` (the orchestrator's clock, as every record's)."""
    line = encode_entry(
        {
            "seq": 1,
            "endpoint": base.checkpoint.endpoint,
            "ts": clock(),
            "event": events.LOG_BASE,
            "data": base.data(),
        }
    )
    persistence.atomic_write(base_path(log_path), line)


def deletable(sealed: list[Segment], checkpoint: Checkpoint) -> list[Segment]:
    """The segments ``checkpoint`` lets go (see the module docstring), oldest first."""
    return [s for s in sealed[:-1] if s.last < checkpoint.at.file_first]


def deleted_through(log_path: str | os.PathLike[str]) -> int:
    """Through which entry the log was deleted by the compaction policy (0: none; also
    0 for a base that does not read, whose loss fsck and recovery report)."""
    if first_kept(log_path) == 1:
        return 0
    try:
        base = read_base(log_path)
    except BaseUnreadable:
        return 0
    return 0 if base is None else base.deleted_through


def base_candidates(log_path: str | os.PathLike[str], first: int) -> list[Checkpoint]:
    """The checkpoint in the log's base, when its files start at ``first`` > 1 (its
    first segments deleted); none for a log that starts at 1 or whose base is damaged:
    then nothing may say what the deleted part held."""
    if first == 1:
        return []
    try:
        base = read_base(log_path)
    except BaseUnreadable:
        return []
    return [] if base is None else [base.checkpoint]


def first_kept(log_path: str | os.PathLike[str]) -> int:
    """The first ``seq`` the log's files hold: 1, or past the segments deleted.

    Only segment names and the start record say so
    (:func:`~substrat.segments.active_start`): an active file whose first entry is
    past 1 with neither may have lost its first lines to damage (each costs only
    itself), not to a deletion.
    """
    sealed = list_sealed(log_path)
    return sealed[0].first if sealed else active_start(log_path, sealed)


def delete_covered(
    log_path: str | os.PathLike[str],
    checkpoint: Checkpoint,
    turns_of: Callable[[list[Entry]], list[TurnRecord]],
    clock: Clock = utc_now_iso,
) -> list[Segment]:
    """Delete the sealed segments ``checkpoint`` lets go, its base written first.

    ``checkpoint`` must be durable (its append to the store fsynced) and hold
    against the log; it becomes the base's checkpoint. ``turns_of`` gives the
    conversation's turns completed in some entries
    (:func:`substrat.conversation.conversation_from_entries`); ``clock`` stamps the
    base. Returns the segments
    deleted. Raises BaseUnreadable (deleting nothing) if the log's prefix is
    already gone and its base does not read: the turns it held cannot be
    carried on.
    """
    sealed = list_sealed(log_path)
    victims = deletable(sealed, checkpoint)
    if not victims:
        return []
    try:
        old = read_base(log_path)
    except BaseUnreadable:
        if sealed[0].first > 1:
            raise
        old = None  # nothing deleted yet: the log itself holds everything
    floor = 0 if old is None else old.deleted_through
    if floor == 0 and sealed[0].first > 1:
        raise BaseUnreadable(f"{log_path}: its first entries are gone and it has no base")
    entries = [e for s in victims if s.last > floor for e in segment_entries(s, floor)]
    turns = [*(old.turns if old else []), *turns_of(entries)]
    through = max(floor, victims[-1].last)
    write_base(log_path, LogBase(through, checkpoint.held(), turns), clock)
    for segment in victims:
        delete_segment(segment)
    return victims


def delete_segment(segment: Segment) -> None:
    """Remove a sealed segment (both copies, if an archive was interrupted), durably."""
    if segment.archived:
        plain = segment.path.with_name(segment.path.name[: -len(ARCHIVE_SUFFIX)])
        archived = segment.path
    else:
        plain, archived = segment.path, segment.path.with_name(segment.path.name + ARCHIVE_SUFFIX)
    persistence.durable_unlink(plain)
    persistence.durable_unlink(archived)


def read_facts(session_id: str, log_path: str | os.PathLike[str]) -> AgentFacts:
    """:func:`substrat.facts.read_facts`, from the log's base when its first segments
    were deleted (the base's checkpoint, then the entries after it). A log without its
    start and no base that reads is read as it is (fsck and recovery say it is not
    whole)."""
    if first_kept(log_path) == 1:
        return read_whole_log(session_id, log_path)
    try:
        base = read_base(log_path)
        return (
            read_whole_log(session_id, log_path)
            if base is None
            else facts_from(base.checkpoint, log_path)
        )
    except ValueError:
        return read_whole_log(session_id, log_path)


def facts_from(checkpoint: Checkpoint, log_path: str | os.PathLike[str]) -> AgentFacts:
    """The log's facts: ``checkpoint``'s, then the log's entries after it (ValueError if
    its facts do not read). The caller has checked that it holds against the log."""
    facts = checkpoint.load_facts()
    damage = DamageReport()
    floor = checkpoint.at.seq
    for entry in iter_log(log_path, damage):
        if entry["seq"] > floor:
            facts.add(entry)
    for kind, count in damage.counts().items():
        facts.damage[kind] = facts.damage.get(kind, 0) + count
    return facts
