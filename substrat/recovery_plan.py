"""What recovery would do, per agent, without writing anything.

``substrat recover --dry-run`` and ``substrat fsck`` use it: it reads the same
facts as :func:`substrat.recovery.recover` from the logs and records, and
reports per agent the last completed turn, the turn lost in flight, the
messages to redeliver and the effects to roll forward.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from substrat import access, persistence
from substrat.access import Unreadable
from substrat.agents import USER
from substrat.checkpoints import Checkpoint, read_store, verify
from substrat.facts import AgentFacts
from substrat.logbase import base_candidates, facts_from, first_kept, read_facts
from substrat.recovery_logs import HistoryGone
from substrat.registry import (
    RegistryRead,
    creation_from_registry,
    lost_root,
    quarantined_sessions,
    read_registry,
)
from substrat.session import SessionState, SessionStore


@dataclass
class AgentPlan:
    """What recovery would do for one agent (``substrat recover --dry-run``)."""

    session_id: str
    agent_id: str | None
    name: str | None
    path: str | None
    """``parent/child``, as ``substrat agent list`` shows it (None: no agent.created)."""
    status: str
    last_completed_turn: dict[str, Any] | None
    lost_turn: dict[str, Any] | None
    to_redeliver: list[str]
    to_reconcile: list[str]
    damage: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class RecoveryPlan:
    agents: list[AgentPlan]
    user_pending: list[str]
    quarantined: list[dict[str, str]]
    lost_roots: list[dict[str, Any]] = field(default_factory=list)
    """Registered roots whose directory is gone (lost data)."""
    roots_to_register: list[str] = field(default_factory=list)
    creations_to_rebuild: list[str] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)
    registry_problem: str | None = None
    read_only: bool = False
    """The root is on a read-only file system: the plan was read, nothing of it can run
    there (no agent is called unreadable for it: the whole root is)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "agents": [a.to_dict() for a in self.agents],
            "user_pending": list(self.user_pending),
            "quarantined": list(self.quarantined),
            "lost_roots": list(self.lost_roots),
            "roots_to_register": list(self.roots_to_register),
            "creations_to_rebuild": list(self.creations_to_rebuild),
            "unreadable": [u.to_dict() for u in self.unreadable],
            "registry_problem": self.registry_problem,
            "read_only": self.read_only,
        }


def analyze(root: str | os.PathLike[str], *, then: str = "restart the daemon") -> RecoveryPlan:
    """What recovery would do, per agent, without writing anything.

    ``then`` ends the advice given for an unreadable agent (see substrat.access).
    """
    store = SessionStore(root)
    scan = store.scan(quarantine=False)
    unreadable = {
        sid: access.unreadable(sid, store.session_dir(sid), exc, then=then)
        for sid, exc in scan.unreadable.items()
    }
    records = {s.session_id: s for s in scan.sessions}
    directories = sorted(
        set(records)
        | set(scan.missing_records)
        | {q.name for q in scan.quarantined if q.is_session}
    )
    read_only = persistence.on_read_only_fs(root)
    checkpoints = read_store(root)
    facts: dict[str, AgentFacts] = {}
    for sid in directories:
        try:
            facts[sid] = _facts(sid, store.log_path(sid), checkpoints.checkpoints.get(sid, []))
            if not read_only:
                _check_writable(store.log_path(sid))
        except OSError as exc:
            unreadable[sid] = access.unreadable(sid, store.log_path(sid), exc, then=then)
        except HistoryGone as gone:
            unreadable[sid] = access.history_gone(sid, store.log_path(sid), gone.first, then=then)
    for sid in unreadable:
        records.pop(sid, None)
    registry = read_registry(root)
    lost, rebuild = _registered(registry, store, facts, records, set(directories) | set(unreadable))
    _hold_descendants(store, facts, records, unreadable, then)
    sids = sorted(facts)
    user = read_facts(USER, Path(root) / "user" / "events.jsonl")
    # Each recipient's facts answer "received?" as a start asks it (AgentFacts.received):
    # a checkpoint keeps delivered messages only as ids or as a sender's settled turn.
    known: dict[str, AgentFacts] = {USER: user}
    agent_session = {}
    for sid, f in facts.items():
        if f.created is not None:
            agent_session[str(f.created.get("agent_id"))] = sid
            known[str(f.created.get("agent_id"))] = f
    spawned = {
        s["session_id"] for f in facts.values() for e in f.committed for s in e.get("spawns", [])
    }
    for f in facts.values():  # a child still to be spawned has an (empty) inbox to fill
        for e in f.committed:
            for spawn in e.get("spawns", []):
                known.setdefault(str(spawn["agent_id"]), AgentFacts(str(spawn["session_id"])))

    def dead(sid: str) -> bool:
        record = records.get(sid)
        return facts[sid].terminated or (
            record is not None and record.state is SessionState.TERMINATED
        )

    # Recovery also terminates what a committed turn ordered terminated, and everything
    # under a terminated agent (a cascade cut short); the plan must say so, not "live".
    ordered = {
        agent_session[agent_id]
        for f in facts.values()
        for e in f.committed
        for agent_id in e.get("terminations", [])
        if agent_id in agent_session and not dead(agent_session[agent_id])
    }

    def ancestors(sid: str) -> list[str]:
        chain: list[str] = []
        cursor = (facts[sid].created or {}).get("parent_session_id")
        while cursor is not None and cursor in facts and cursor not in chain and cursor != sid:
            chain.append(cursor)
            cursor = (facts[cursor].created or {}).get("parent_session_id")
        return chain

    def cascaded(sid: str) -> bool:
        return any(dead(a) for a in ancestors(sid))

    def doomed(sid: str) -> str | None:
        if cascaded(sid):  # done while the tree is built, before any roll-forward
            return "will be terminated (an ancestor was terminated)"
        if sid in ordered or any(a in ordered for a in ancestors(sid)):
            return "will be terminated (a committed turn ordered it)"
        return None

    def path_of(sid: str) -> str | None:
        created = facts[sid].created
        if created is None:
            return None
        names = [str(created.get("name"))]
        for above in ancestors(sid):
            names.append(str((facts[above].created or {}).get("name", "?")))
        return "/".join(reversed(names))

    plans = []
    for sid in sids:
        f = facts[sid]
        record = records.get(sid)
        if dead(sid):
            status = "terminated"
        elif f.created is None and sid in registry.roots:
            status = "lost (its log is gone)"
        elif f.created is None:
            status = "spawn to roll forward" if sid in spawned else "orphan (will be terminated)"
        elif (fate := doomed(sid)) is not None:
            status = fate
        elif record is None:
            status = "record to rebuild from the log"
        else:
            status = "live"
        reconcile = []
        if status == "live" or status.startswith(("record", "spawn")):
            for effects in f.committed:
                for data in effects.get("messages", []):
                    target = known.get(data["recipient"])
                    target_sid = agent_session.get(data["recipient"])
                    if target_sid is not None and (dead(target_sid) or cascaded(target_sid)):
                        continue  # recovery drops a message whose reader is gone
                    if target is not None and not target.received(data):
                        reconcile.append(data["message_id"])
                for agent_id in effects.get("terminations", []):
                    target_sid = agent_session.get(agent_id)
                    if target_sid is not None and not dead(target_sid):
                        name = (facts[target_sid].created or {}).get("name")
                        reconcile.append(f"terminate {name}")
                for spawn in effects.get("spawns", []):
                    child = facts.get(spawn["session_id"])
                    if spawn["session_id"] in unreadable:
                        continue  # held back with its files; recovery leaves it alone
                    if child is None or child.created is None:
                        reconcile.append(f"spawn {spawn['name']}")
        plans.append(
            AgentPlan(
                session_id=sid,
                agent_id=None if f.created is None else str(f.created.get("agent_id")),
                name=None if f.created is None else str(f.created.get("name")),
                path=path_of(sid),
                status=status,
                last_completed_turn=f.last_complete,
                lost_turn=f.lost_turn_with_doubt,
                to_redeliver=[m["message_id"] for m in f.pending()],
                to_reconcile=reconcile,
                damage=f.damage,
            )
        )
    for sid, item in sorted(unreadable.items()):
        plans.append(
            AgentPlan(
                session_id=sid,
                agent_id=None,
                name=None,
                path=None,
                status="held (an ancestor is unreadable)" if item.held_by else "unreadable",
                last_completed_turn=None,
                lost_turn=None,
                to_redeliver=[],
                to_reconcile=[],
                damage={},
            )
        )
    quarantined = [{"name": q.name, "kind": q.kind, "reason": q.reason} for q in scan.quarantined]
    to_register = [
        p.session_id
        for p in plans
        if p.status in ("live", "record to rebuild from the log")
        and (facts[p.session_id].created or {}).get("parent_session_id") is None
        and p.session_id not in registry.roots
        and registry.problem is None
    ]
    return RecoveryPlan(
        sorted(plans, key=lambda p: p.session_id),
        [m["message_id"] for m in user.pending()],
        quarantined,
        lost_roots=lost,
        roots_to_register=to_register,
        creations_to_rebuild=rebuild,
        unreadable=access.named(
            unreadable, {sid: str(data.get("name")) for sid, data in registry.roots.items()}
        ),
        registry_problem=registry.problem,
        read_only=read_only,
    )


def _facts(sid: str, log: Path, stored: list[Checkpoint]) -> AgentFacts:
    """An agent's facts as a start reads them: a log whose first entries are gone is
    read from a checkpoint of it that holds (the store's newest first, then the log's
    base); with none, a start holds the agent back (:class:`HistoryGone`), since
    nothing says what they held."""
    first = first_kept(log)
    if first == 1:
        return read_facts(sid, log)
    candidates = [*reversed(stored), *base_candidates(log, first)]
    for checkpoint in candidates:
        if verify(checkpoint, log) is not None:
            continue
        try:
            return facts_from(checkpoint, log)
        except ValueError:
            continue
    raise HistoryGone(first)


def _check_writable(log: Path) -> None:
    """Recovery opens every log it repairs for writing: a read-only one holds its agent back."""
    if os.path.exists(log) and not os.access(log, os.W_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(log))


def _registered(
    registry: RegistryRead,
    store: SessionStore,
    facts: dict[str, AgentFacts],
    records: dict[str, Any],
    directories: set[str],
) -> tuple[list[dict[str, Any]], list[str]]:
    """Registered roots that are lost, and those whose creation recovery rebuilds (and
    does so in ``facts``, as recovery would)."""
    lost: list[dict[str, Any]] = []
    rebuild: list[str] = []
    gone = quarantined_sessions(store)
    for sid, data in sorted(registry.roots.items()):
        if sid not in directories:
            if sid not in gone:
                lost.append(lost_root(data))
            continue
        f = facts.get(sid)
        record = records.get(sid)
        if f is None or (record is not None and record.state is SessionState.TERMINATED):
            continue
        if f.entries == 0 and not f.damage and not os.path.exists(store.log_path(sid)):
            lost.append(lost_root(data, what="events.jsonl"))
            continue
        if f.created is None and not f.terminated:
            creation_from_registry(f, data)
            rebuild.append(sid)
    return lost, rebuild


def _hold_descendants(
    store: SessionStore,
    facts: dict[str, AgentFacts],
    records: dict[str, Any],
    unreadable: dict[str, Unreadable],
    then: str,
) -> None:
    """Move the live descendants of unreadable agents from ``facts`` to ``unreadable``
    (a terminated one stays terminated: a start does not read it)."""
    changed = True
    while changed:
        changed = False
        for sid, f in sorted(facts.items()):
            parent = (f.created or {}).get("parent_session_id")
            record = records.get(sid)
            if f.terminated or (record is not None and record.state is SessionState.TERMINATED):
                continue
            if parent in unreadable:
                ancestor = unreadable[parent].held_by or parent
                name = str((f.created or {}).get("name"))
                where = store.session_dir(sid)
                unreadable[sid] = access.held(sid, where, ancestor, then=then, name=name)
                del facts[sid]
                changed = True
