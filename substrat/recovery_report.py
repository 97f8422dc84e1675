"""What recovery found and did: the report the daemon publishes as ``daemon.recovered``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from substrat.access import Unreadable
from substrat.session import Quarantined


@dataclass
class RecoveryReport:
    """What recovery found and did; the daemon publishes it as ``daemon.recovered``."""

    agents: int = 0
    roots: int = 0
    orphans_terminated: list[str] = field(default_factory=list)
    cascaded: list[str] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    unrecoverable: list[str] = field(default_factory=list)
    detached: list[str] = field(default_factory=list)
    lost_turns: list[dict[str, Any]] = field(default_factory=list)
    redelivered: list[str] = field(default_factory=list)
    reconciled: list[str] = field(default_factory=list)
    records_rebuilt: list[str] = field(default_factory=list)
    log_repairs: dict[str, dict[str, Any]] = field(default_factory=dict)
    log_damage: dict[str, dict[str, int]] = field(default_factory=dict)
    events_read: int = 0
    lost_roots: list[dict[str, Any]] = field(default_factory=list)
    """Registered root agents whose directory is gone: lost data (see substrat.registry)."""
    roots_registered: list[str] = field(default_factory=list)
    """Live roots the registry lacked (a crash right after their creation, or a damaged
    registry line), registered now."""
    creations_rebuilt: list[str] = field(default_factory=list)
    """Registered roots whose ``agent.created`` was unreadable, logged again from the registry."""
    unreadable: list[Unreadable] = field(default_factory=list)
    """Agents held back (not served, not changed) because their files failed (EACCES,
    EIO, ...), and their descendants; each says what to do (see substrat.access)."""
    registry_problem: str | None = None
    """Why the root registry could not be read (roots cannot be created until it is fixed)."""
    checkpoints_used: int = 0
    """Logs read from a checkpoint on (only the entries after it were read)."""
    checkpoints_rejected: dict[str, str] = field(default_factory=dict)
    """Endpoint -> why its checkpoint did not hold against its log (that log was read
    from its start instead: see substrat.checkpoints)."""
    read_in_full: list[str] = field(default_factory=list)
    """Endpoints whose log was read from its start (no checkpoint of it held)."""
    log_gaps: dict[str, list[list[int]]] = field(default_factory=dict)
    """Endpoint -> the ``[first, last]`` seq ranges missing whole from the part of its log
    that was read (after the checkpoint that held, or all of it): lines removed, or
    quarantined by ``fsck --repair`` (see substrat.logread)."""
    checkpoints_set_aside: str | None = None
    """Why no checkpoint of the store was used, if a checkpoint that did not hold or a
    log's damage made every log read from its start (see substrat.recovery)."""
    start_summary: str | None = None
    """Why the start summary was not used, if there was one (see substrat.start_summary)."""
    summary_used: int = 0
    """Agents started from their start summary entry (record and log end not read)."""
    summary_passed_over: list[str] = field(default_factory=list)
    """Agents whose start summary entry did not hold (read as without a summary)."""
    incidents: list[dict[str, Any]] = field(default_factory=list)
    """Every incident on record not acknowledged yet (substrat.incidents), as its
    ``to_dict``: each says what happened and how to acknowledge it."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "agents": self.agents,
            "roots": self.roots,
            "orphans_terminated": list(self.orphans_terminated),
            "cascaded": list(self.cascaded),
            "quarantined": [
                {"name": q.name, "kind": q.kind, "reason": q.reason, "moved_to": q.moved_to}
                for q in self.quarantined
            ],
            "unrecoverable": list(self.unrecoverable),
            "detached": list(self.detached),
            "lost_turns": list(self.lost_turns),
            "redelivered": list(self.redelivered),
            "reconciled": list(self.reconciled),
            "records_rebuilt": list(self.records_rebuilt),
            "log_repairs": dict(self.log_repairs),
            "log_damage": dict(self.log_damage),
            "events_read": self.events_read,
            "lost_roots": list(self.lost_roots),
            "roots_registered": list(self.roots_registered),
            "creations_rebuilt": list(self.creations_rebuilt),
            "unreadable": [u.to_dict() for u in self.unreadable],
            "registry_problem": self.registry_problem,
            "checkpoints_used": self.checkpoints_used,
            "checkpoints_rejected": dict(self.checkpoints_rejected),
            "read_in_full": list(self.read_in_full),
            "log_gaps": {e: [list(r) for r in ranges] for e, ranges in self.log_gaps.items()},
            "checkpoints_set_aside": self.checkpoints_set_aside,
            "start_summary": self.start_summary,
            "summary_used": self.summary_used,
            "summary_passed_over": list(self.summary_passed_over),
            "incidents": list(self.incidents),
        }
