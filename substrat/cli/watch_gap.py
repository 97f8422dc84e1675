"""What ``watch`` did not see while it reconnected, caught up from the agents' logs.

A daemon that starts again redelivers pending messages, and its agents may run
turns before ``watch`` has subscribed again: their events went to nobody. So
after every reconnect ``watch`` reads the logs (read only, as ``compact
--dry-run`` does while the daemon serves) for the turns logged since the last
event it received, and shows the ones it has not shown, in the order of their
times, marked ``caught_up``. It subscribes first, so a turn logged while it reads
comes live too; each turn event is shown once (by agent, turn and kind). Only
turns are in the logs in a form to show; what else happened meanwhile (messages,
tool calls) the gap notice (``connection.gap``) names with where to find it.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from substrat import events
from substrat.eventlog import LOG_NAME
from substrat.logread import read_log
from substrat.segments import list_sealed
from substrat.session.store import AGENTS_DIR

MARGIN_S = 5.0
"""Entries logged this long before the last event watch received are read again: an
entry is logged before its event is sent, so one logged just before the last event
seen may still have had its event lost; the keys keep anything from showing twice."""
KEPT_KEYS = 100_000
"""The turn events remembered as shown (the oldest forgotten first): far more than a
gap's margin holds."""

_AS_EVENTS = {
    events.TURN_START: "turn.started",
    events.TURN_COMPLETE: "turn.completed",
    events.TURN_FAILED: "turn.failed",
}
_FIELDS = {
    "turn.started": ("turn_id",),
    "turn.completed": ("turn_id", "prompt", "response"),
    "turn.failed": ("turn_id", "error"),
}


Event = tuple[str, dict[str, Any]]


class Shown:
    """The turn events watch showed, and the time of the last event it received."""

    def __init__(self, started: str | None = None) -> None:
        self.started = started
        """When watch started: nothing logged before it is caught up, margin or not."""
        self.last_time: str | None = started
        self._keys: set[tuple[str, str, str]] = set()
        self._order: deque[tuple[str, str, str]] = deque()

    def received(self, name: str, params: dict[str, Any]) -> None:
        stamp = params.get("time")
        if isinstance(stamp, str) and not name.startswith("connection."):
            self.last_time = stamp if self.last_time is None else max(self.last_time, stamp)

    def first_time(self, name: str, params: dict[str, Any]) -> bool:
        """Whether this turn event is new (other events always are); notes it as shown."""
        if name not in _FIELDS:
            return True
        key = (name, str(params.get("agent_id")), str(params.get("turn_id")))
        if key in self._keys:
            return False
        self._keys.add(key)
        self._order.append(key)
        if len(self._order) > KEPT_KEYS:
            self._keys.discard(self._order.popleft())
        return True


def missed(
    root: Path, since: str, agents: list[dict[str, Any]], started: str | None = None
) -> list[Event]:
    """The turn events ``agents`` (``agent.list``'s answer) logged after ``since`` (ISO
    time, less :data:`MARGIN_S`, but not before ``started``, when watch began: the
    margin must not show a turn from before it), oldest first, each marked
    ``caught_up``. A log that does not read costs only itself."""
    cutoff = datetime.fromisoformat(since) - timedelta(seconds=MARGIN_S)
    # Entries before the start are not shown; the files are still picked by the margin's
    # cutoff: a modification time (a coarse clock) may read a little before the write.
    shown_from = max(cutoff, datetime.fromisoformat(started)) if started else cutoff
    found: list[Event] = []
    for agent in agents:
        log_path = root / AGENTS_DIR / str(agent.get("session_id")) / LOG_NAME
        with contextlib.suppress(OSError, ValueError):
            found += _logged_after(log_path, cutoff, str(agent.get("agent_id")), shown_from)
    found.sort(key=lambda event: str(event[1]["time"]))
    return found


def _logged_after(
    log_path: Path, cutoff: datetime, agent_id: str, shown_from: datetime
) -> list[Event]:
    if os.stat(log_path).st_mtime < cutoff.timestamp():
        return []  # nothing was written to it since (a roll makes a new active file)
    entries = read_log(log_path, sealed=[]).entries
    if not entries or _when(entries[0]) > cutoff:  # it rolled since: its last segment too
        entries = read_log(log_path, sealed=list_sealed(log_path)[-1:]).entries
    out: list[Event] = []
    for entry in entries:
        name = _AS_EVENTS.get(entry.get("event", ""))
        data = entry.get("data") or {}
        if name is None or data.get("reserved") or _when(entry) <= shown_from:
            continue  # (a reserved number, written by fsck --repair, is no turn)
        params = {key: data.get(key) for key in _FIELDS[name] if key in data}
        out.append(
            (name, {"agent_id": agent_id, **params, "time": entry.get("ts"), "caught_up": True})
        )
    return out


def _when(entry: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(entry.get("ts")))
