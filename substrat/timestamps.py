"""The time as the event log writes it (an entry's ``ts``), in a module of its own.

A new root's marker (:mod:`substrat.rootmarker`) and a lock record marked recovered
(:mod:`substrat.rpc.lock`) stamp the time as well. Importing :mod:`substrat.eventlog`
for it loaded the log's readers and writers too (about 20 ms of CPU) in every command
that makes a root: ``daemon start`` and ``agent create`` on a new path.
"""

from __future__ import annotations

from datetime import UTC, datetime


def utc_now_iso() -> str:
    """The current time as an ISO 8601 UTC string (the log's ``ts`` format)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")
