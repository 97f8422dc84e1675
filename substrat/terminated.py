"""Terminated agents: gone from the tree, but their logs are kept and can be read.

The orchestrator forgets a terminated agent (a long-lived daemon must not
grow with every dead agent), so what the CLI shows of one (``agent list
--all``, ``agent show``, ``log``, and "agent lead was terminated at ..." when
something is sent to it) is read back from disk: the session records say
which sessions are terminated, their logs say who the agent was
(``agent.created``) and when it ended (``agent.terminated``).

The index is built on the first question and then kept up to date as agents
are terminated; each entry is a few short strings (no instructions, no
conversation: those are read from the log when asked).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from substrat import events
from substrat.logbase import read_base
from substrat.logread import DamageReport, iter_log
from substrat.session import SessionState, SessionStore


@dataclass(frozen=True)
class TerminatedAgent:
    """What is kept in memory of one terminated agent."""

    agent_id: str
    session_id: str
    name: str
    parent_session_id: str | None
    provider: str
    model: str
    terminated_at: str | None
    """When ``agent.terminated`` was logged (None if the log lost that line)."""


def read_terminated(store: SessionStore, session_id: str) -> TerminatedAgent | None:
    """The terminated agent a session's log describes; None if it never was an agent."""
    created: dict[str, Any] | None = None
    provider = model = ""
    terminated_at: str | None = None
    for entry in iter_log(store.log_path(session_id), DamageReport()):
        event, data = entry.get("event"), entry.get("data") or {}
        if event == events.SESSION_CREATED:
            provider, model = str(data.get("provider", "")), str(data.get("model", ""))
        elif event == events.AGENT_CREATED:
            created = data
        elif event == events.AGENT_TERMINATED:
            terminated_at = str(entry.get("ts") or "") or None
    if created is None:  # its first segments deleted by the compaction policy, or an orphan
        created, provider, model = _created_from_base(store.log_path(session_id), provider, model)
    if created is None:  # an orphan of a crashed creation: never acknowledged to anyone
        return None
    parent = created.get("parent_session_id")
    return TerminatedAgent(
        agent_id=str(created.get("agent_id")),
        session_id=session_id,
        name=str(created.get("name")),
        parent_session_id=str(parent) if parent else None,
        provider=provider,
        model=model,
        terminated_at=terminated_at,
    )


def _created_from_base(
    log_path: Path, provider: str, model: str
) -> tuple[dict[str, Any] | None, str, str]:
    """``agent.created`` (and the provider and model) from the log's base, when the
    ``delete`` compaction policy removed the entries holding them."""
    try:
        base = read_base(log_path)
        facts = None if base is None else base.checkpoint.load_facts()
    except ValueError:
        return None, provider, model
    if facts is None:
        return None, provider, model
    session = facts.session_created or {}
    return (
        facts.created,
        provider or str(session.get("provider", "")),
        model or str(session.get("model", "")),
    )


def read_instructions(log_path: Path) -> str:
    """The instructions an agent was created with, from its log (or its base)."""
    for entry in iter_log(log_path, DamageReport()):
        if entry.get("event") == events.AGENT_CREATED:
            return str((entry.get("data") or {}).get("instructions", ""))
    created, _, _ = _created_from_base(log_path, "", "")
    return str((created or {}).get("instructions", ""))


class Graveyard:
    """The terminated agents of a root, by agent id (loaded from disk on first use)."""

    def __init__(self, store: SessionStore) -> None:
        self._store = store
        self._by_id: dict[str, TerminatedAgent] | None = None
        self._by_session: dict[str, str] = {}

    def _load(self) -> dict[str, TerminatedAgent]:
        if self._by_id is None:
            self._by_id = {}
            for session in self._store.scan(quarantine=False).sessions:
                if session.state is SessionState.TERMINATED:
                    try:
                        found = read_terminated(self._store, session.session_id)
                    except OSError:  # unreadable (EACCES, EIO): left out, like a live one
                        continue
                    if found is not None:
                        self._add(found)
        return self._by_id

    def _add(self, agent: TerminatedAgent) -> None:
        assert self._by_id is not None
        self._by_id[agent.agent_id] = agent
        self._by_session[agent.session_id] = agent.agent_id

    def buried(self, agent: TerminatedAgent) -> None:
        """An agent was just terminated (a no-op until the index is first loaded)."""
        if self._by_id is not None:
            self._add(agent)

    def all(self) -> list[TerminatedAgent]:
        """Every terminated agent, most recently terminated last."""
        return sorted(self._load().values(), key=lambda a: (a.terminated_at or "", a.name))

    def get(self, agent_id: str) -> TerminatedAgent | None:
        return self._load().get(agent_id)

    def path(self, agent: TerminatedAgent, live_path: Callable[[str], str | None]) -> str:
        """``parent/child`` as it was; ``live_path(session_id)`` names a parent still alive."""
        names = [agent.name]
        parent = agent.parent_session_id
        seen = {agent.session_id}
        while parent is not None and parent not in seen:
            seen.add(parent)
            alive = live_path(parent)
            if alive is not None:
                names.append(alive)
                break
            above = self._by_session.get(parent)
            if above is None:
                names.append("?")  # a parent this root no longer knows
                break
            node = self._load()[above]
            names.append(node.name)
            parent = node.parent_session_id
        return "/".join(reversed(names))
