"""Where a log may start, checked after a recovery.

A log normally starts at entry 1. The ``delete`` compaction policy may leave one
that starts later, with a base that sums up what was removed; the start record
(``events.start``) says where the active file starts. These checks take what the
caller has already read (the log, its base, its path) and return the problems
found, one line each, so they know nothing of the orchestrator.
"""

from __future__ import annotations

import os

from substrat.checkpoints import verify
from substrat.eventlog import LogRead
from substrat.logbase import LogBase
from substrat.segments import StartUnreadable, active_first, list_sealed, read_start


def deleted_range_problems(
    who: str,
    read: LogRead,
    base: LogBase | None,
    path: str | os.PathLike[str],
    compaction: str,
) -> list[str]:
    """A log may start after entry 1 only as the ``delete`` compaction policy leaves it.

    Its base must read and cover the missing entries (``deleted_through``), its
    checkpoint must hold against the log (so it was durable and is usable), the
    log must go on right after what the base deleted (entries acknowledged and not
    covered are all there), and the policy (``compaction``) must be ``delete``.
    """
    first = read.entries[0]["seq"] if read.entries else 1
    if first == 1:
        return []
    if base is None:
        return [f"{who} starts at entry {first} and has no base: entries 1-{first - 1} are lost"]
    problems = []
    if compaction != "delete":
        problems.append(f"{who} lost entries 1-{first - 1} without the delete policy")
    if base.deleted_through < first - 1:
        problems.append(
            f"{who} starts at entry {first}, its base covers only 1-{base.deleted_through}"
        )
    why = verify(base.checkpoint, path)
    if why is not None:
        problems.append(f"{who}: its base's checkpoint does not hold ({why})")
    return problems


def start_record_problems(who: str, read: LogRead, path: str | os.PathLike[str]) -> list[str]:
    """A log's start record (``events.start``) must read and never be ahead of its log.

    It says which entry the active file starts at; written after the roll's rename,
    it may lag (a crash before it) but never names an entry past the active file's
    first, nor past the end of the sealed segments: that would claim entries lost
    that are there.
    """
    try:
        recorded = read_start(path)
    except StartUnreadable as exc:
        return [f"{who}: its start record does not read after a crash: {exc}"]
    if recorded is None:
        return []
    sealed = list_sealed(path)
    in_active = [e["seq"] for e in read.entries if not sealed or e["seq"] > sealed[-1].last]
    limit = min([active_first(sealed), *in_active[:1]])
    if recorded > limit:
        return [
            f"{who}: its start record says the active file starts at entry "
            f"{recorded}, but entry {limit} is "
            + ("in it" if in_active[:1] == [limit] else "where it starts")
        ]
    return []
