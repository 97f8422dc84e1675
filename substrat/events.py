"""The names of the events substrat writes to its logs.

The full table, with each event's fields, is in ``docs/events.md``. A reader
meeting a name that is not here (a newer version wrote it) skips the entry and
reports it; it never fails on it.
"""

from __future__ import annotations

SESSION_CREATED = "session.created"
SESSION_RESTORED = "session.restored"
SUSPEND_RESULT = "suspend.result"
TURN_START = "turn.start"
TURN_COMPLETE = "turn.complete"
TURN_FAILED = "turn.failed"
AGENT_CREATED = "agent.created"
AGENT_TERMINATED = "agent.terminated"
MESSAGE_ENQUEUED = "message.enqueued"
MESSAGE_DELIVERED = "message.delivered"
TOOL_REPAIRED = "tool.repaired"
PROVIDER_SESSION = "provider.session"
ROOT_REGISTERED = "root.registered"
"""Written only to the root registry (``roots/events.jsonl``), never to an agent's log."""
CHECKPOINT = "checkpoint"
"""Written only to the checkpoint store (``checkpoints/events.jsonl``)."""
LOG_BASE = "log.base"
"""Written only to a log's base file (``events.base``), before the ``delete`` compaction
policy removes the segments it covers (see :mod:`substrat.logbase`)."""
LOG_START = "log.start"
"""Written only to a log's start record (``events.start``), when its active file is sealed
(see :mod:`substrat.segments`)."""

INCIDENT_RECORDED = "incident.recorded"
"""Written only to the incident log (``incidents/events.jsonl``, :mod:`substrat.incidents`)."""
INCIDENT_ACKNOWLEDGED = "incident.acknowledged"
"""Written only to the incident log, by ``substrat fsck --acknowledge ID``."""

KNOWN_EVENTS: frozenset[str] = frozenset(
    {
        SESSION_CREATED,
        SESSION_RESTORED,
        SUSPEND_RESULT,
        TURN_START,
        TURN_COMPLETE,
        TURN_FAILED,
        AGENT_CREATED,
        AGENT_TERMINATED,
        MESSAGE_ENQUEUED,
        MESSAGE_DELIVERED,
        TOOL_REPAIRED,
        PROVIDER_SESSION,
        ROOT_REGISTERED,
        CHECKPOINT,
        LOG_BASE,
        LOG_START,
        INCIDENT_RECORDED,
        INCIDENT_ACKNOWLEDGED,
    }
)
