"""Recovery: rebuild sessions, the tree, inboxes and conversations from the logs.

Runs when an :class:`~substrat.orchestrator.Orchestrator` opens a root:

1. ``SessionStore.recover()``: ACTIVE records become SUSPENDED (no provider
   session survives a crash); corrupt records are quarantined. A record that
   cannot be read at all (EACCES, EIO) is left alone: that agent is held back
   (see step 8).
2. Every live session's log is repaired (a torn tail cut, a pending entry
   replayed) and distilled into :class:`~substrat.facts.AgentFacts` in the
   same single read; the log is left closed (it is opened for writing when
   first written to). A log that cannot be read or repaired holds its agent
   back. The turn counter is the highest turn any entry names
   (:mod:`substrat.facts`), so ids are never handed out twice.
3. The root registry (:mod:`substrat.registry`) is read: a registered root
   whose directory is gone is reported as lost (``lost_roots``); a registered
   root whose ``agent.created`` is unreadable gets it back from the registry
   (``creations_rebuilt``, logged again).
4. Records lost to damage are rebuilt from ``session.created`` and
   ``agent.created`` when the log has them.
5. The tree is rebuilt from ``agent.created`` / ``agent.terminated``. A
   session with no ``agent.created`` that no committed turn spawned and the
   registry does not know is an orphan of a crash during ``create_root``: it
   is marked TERMINATED. An agent whose ancestor was terminated is terminated
   too (a cascade cut short). Live roots the registry lacks are registered.
6. Committed turns are rolled forward: a child their ``turn.complete`` spawned
   but that does not exist, a message it sent that the recipient's log never
   received (this is how a reply stranded in B's log reaches A), a
   termination it ordered.
7. Inboxes (the user's included) are rebuilt as enqueued minus delivered.
   A turn started but never completed is the one lost in flight; the agent is
   told at its next turn (``resume_roots`` gives roots that turn at once).
8. Agents held back (``unreadable``: their files failed, or an ancestor's did)
   are not served and nothing of theirs is written; the report says what to do
   (:mod:`substrat.access`), and they come back at the next start once fixed.

Every step checks before it writes, so recovery is idempotent: running it
twice, or crashing during it and running it again, ends in the same state.
:func:`analyze` does the same reading without writing anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from substrat import access, events
from substrat.access import Unreadable
from substrat.agents import USER, AgentNode, AgentState, MessageEnvelope
from substrat.eventlog import repair_log
from substrat.facts import AgentFacts as AgentFacts
from substrat.facts import collect_facts as collect_facts
from substrat.facts import read_facts as read_facts
from substrat.registry import (
    REGISTRY_DIR,
    RegistryRead,
    creation_from_registry,
    lost_root,
    quarantined_sessions,
    root_entry,
)
from substrat.session import Quarantined, Session, SessionState

if TYPE_CHECKING:
    from substrat.orchestrator import Orchestrator
    from substrat.recovery_plan import RecoveryPlan

RESUME_PROMPT = "Continue where you left off."
THEN = "restart the daemon"
"""The step after fixing an unreadable agent (see substrat.access)."""
_NOTICE_PROMPT_CHARS = 200


def lost_turn_notice(lost: dict[str, Any]) -> str:
    """The note prepended to an agent's first prompt after it lost a turn."""
    prompt = str(lost.get("prompt", ""))
    if len(prompt) > _NOTICE_PROMPT_CHARS:
        prompt = prompt[:_NOTICE_PROMPT_CHARS] + "..."
    return (
        f"[substrat: the daemon restarted. Your turn {lost.get('turn_id')} (prompt: {prompt!r}) "
        "was lost in flight: none of its tool calls took effect.]\n"
    )


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
        }


def _rebuilt_record(facts: AgentFacts) -> Session | None:
    created, session_created = facts.created, facts.session_created
    if created is None or session_created is None:
        return None
    state = SessionState.TERMINATED if facts.terminated else SessionState.SUSPENDED
    return Session(
        facts.session_id,
        str(session_created.get("provider", "scripted")),
        str(session_created.get("model", "")),
        state=state,
        agent_id=str(created.get("agent_id", "")),
    )


async def recover(orch: Orchestrator) -> RecoveryReport:
    """Rebuild ``orch`` from its root (see the module docstring). Idempotent."""
    report = RecoveryReport()
    store = orch.store
    scan = store.recover()
    report.quarantined = list(scan.quarantined)
    unreadable = {
        sid: access.unreadable(sid, store.session_dir(sid), exc, then=THEN)
        for sid, exc in scan.unreadable.items()
    }
    registry = orch.roots.load()
    report.registry_problem = registry.problem
    if registry.damage:
        report.log_damage[REGISTRY_DIR] = dict(registry.damage)
    records = {s.session_id: s for s in scan.sessions}
    directories = set(records) | set(scan.missing_records) | set(scan.unreadable)
    directories |= {q.name for q in scan.quarantined if q.kind != "bad_name"}
    candidates = [sid for sid, s in records.items() if s.state is not SessionState.TERMINATED]
    candidates += scan.missing_records
    candidates += [q.name for q in scan.quarantined if q.kind != "bad_name"]

    facts: dict[str, AgentFacts] = {}
    for sid in sorted(set(candidates)):
        path = orch.logs.path(sid)
        try:
            os.stat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            unreadable[sid] = access.unreadable(sid, path, exc, then=THEN)
            continue
        orch.logs.close(sid)  # the repair below must be the only open of this log
        collected = AgentFacts(sid)
        try:
            opened = repair_log(path, collected.add_all)
            kept = opened.kept_damage()
            collected.count_damage(path, kept)
        except OSError as exc:  # EACCES, EIO, a failed fsync: it costs this agent only
            unreadable[sid] = access.unreadable(sid, path, exc, then=THEN)
            continue
        if (
            opened.truncated_bytes
            or opened.pending_replayed
            or opened.pending_discarded
            not in (
                None,
                "already_logged",  # the normal leftover of a crash after a durable append
            )
        ):
            report.log_repairs[sid] = {
                "truncated_bytes": opened.truncated_bytes,
                "pending_replayed": opened.pending_replayed,
                "pending_discarded": opened.pending_discarded,
            }
        collected.damage.update(kept.counts())
        facts[sid] = collected
        report.events_read += collected.entries
        if facts[sid].damage:
            report.log_damage[sid] = facts[sid].damage
    for sid in unreadable:
        records.pop(sid, None)
    candidates = [sid for sid in candidates if sid not in unreadable]

    gone = quarantined_sessions(store)
    for sid, data in sorted(registry.roots.items()):
        if sid not in directories:
            if sid not in gone:
                report.lost_roots.append(lost_root(data))
            continue
        if sid in unreadable or sid not in candidates:
            continue  # held back, or terminated
        root_facts = facts.get(sid)
        if root_facts is None:  # its log is gone: as lost as a missing directory
            report.lost_roots.append(lost_root(data, what="events.jsonl"))
            continue
        if root_facts.created is None and not root_facts.terminated:
            creation_from_registry(root_facts, data)
            report.creations_rebuilt.append(sid)

    for sid in sorted(set(candidates) - records.keys()):
        rebuilt = _rebuilt_record(facts[sid]) if sid in facts else None
        if rebuilt is None:
            report.unrecoverable.append(sid)
            continue
        store.save(rebuilt)
        records[sid] = rebuilt
        report.records_rebuilt.append(sid)

    spawned = {
        spawn["session_id"]
        for f in facts.values()
        for effects in f.committed
        for spawn in effects.get("spawns", [])
    }
    for sid in sorted(records):
        session = records[sid]
        if session.state is SessionState.TERMINATED:
            continue
        f = facts.get(sid)
        if f is not None and f.terminated:
            store.transition(session, SessionState.TERMINATED)
        elif (f is None or f.created is None) and sid not in spawned | registry.roots.keys():
            store.transition(session, SessionState.TERMINATED)
            report.orphans_terminated.append(sid)

    live = {
        sid: f
        for sid, f in facts.items()
        if f.created is not None
        and not f.terminated
        and sid in records
        and records[sid].state is not SessionState.TERMINATED
    }
    _build_tree(orch, live, records, facts, unreadable, report)
    for sid in report.creations_rebuilt:
        if sid in live:
            created = live[sid].created
            assert created is not None
            orch.logs.get(sid).log(events.AGENT_CREATED, created)
    _register_roots(orch, live, registry, report)
    user_log = orch.logs.path(USER)
    user_facts = AgentFacts(USER)
    if os.path.exists(user_log.parent):
        orch.logs.close(USER)
        # repaired and replayed in the same read that collects it, like every other log
        user_facts.damage.update(repair_log(user_log, user_facts.add_all).kept_damage().counts())
    report.events_read += user_facts.entries
    _roll_forward(orch, live, facts, records, user_facts, set(unreadable), report)
    _rebuild_inboxes(orch, live, user_facts, report)
    for node in orch.tree.walk():
        f = live.get(node.session_id)
        if f is None:
            continue
        lost = f.lost_turn
        if lost is not None:
            # Closed durably, so the next start does not report it again; the
            # agent is still told at its next turn (lost_notice).
            orch.logs.get(node.session_id).log(
                events.TURN_FAILED,
                {**lost, "error": "lost in flight: the daemon stopped mid-turn", "lost": True},
            )
            report.lost_turns.append({"agent_id": node.agent_id, **lost})
        node.lost_turn = lost or f.lost_notice
    names = {sid: str(data.get("name")) for sid, data in registry.roots.items()}
    report.unreadable = access.named(unreadable, names)
    report.agents = len(orch.tree)
    report.roots = len(orch.tree.roots())
    orch.tree.check()
    return report


def _register_roots(
    orch: Orchestrator, live: dict[str, AgentFacts], registry: RegistryRead, report: RecoveryReport
) -> None:
    """Register every live root the registry lacks (the tree stays built from the logs)."""
    if registry.problem is not None:
        return  # reported; nothing can be written to it
    for node in orch.tree.roots():
        created = live[node.session_id].created
        assert created is not None
        if created.get("parent_session_id") is None and node.session_id not in registry.roots:
            orch.roots.register(root_entry(node))
            report.roots_registered.append(node.session_id)


def _build_tree(
    orch: Orchestrator,
    live: dict[str, AgentFacts],
    records: dict[str, Session],
    facts: dict[str, AgentFacts],
    unreadable: dict[str, Unreadable],
    report: RecoveryReport,
) -> None:
    """Add live agents parents first; cascade terminations that a crash cut short.

    A descendant of an unreadable agent is held back with it (added to
    ``unreadable``): where it belongs, and whether a cascade reached it, is in
    the log that cannot be read.
    """
    added: set[str] = set()
    pending = dict(live)
    while pending:
        progressed = False
        for sid, f in sorted(pending.items()):
            assert f.created is not None
            parent_sid = f.created.get("parent_session_id")
            if parent_sid in unreadable:
                ancestor = unreadable[parent_sid].held_by or parent_sid
                where = orch.store.session_dir(sid)
                name = str(f.created.get("name"))
                unreadable[sid] = access.held(sid, where, ancestor, then=THEN, name=name)
                del pending[sid]
                progressed = True
                continue
            if parent_sid is not None and parent_sid not in added:
                parent_facts = facts.get(parent_sid)
                parent_dead = (parent_facts is not None and parent_facts.terminated) or (
                    parent_sid in records
                    and records[parent_sid].state is SessionState.TERMINATED
                    and parent_sid not in live
                )
                if parent_dead:
                    _cascade_terminate(orch, sid, f, records[sid], report)
                    del pending[sid]
                    progressed = True
                    continue
                if parent_sid in pending:
                    continue  # its parent is added first
                report.detached.append(sid)
                parent_sid = None
            parent = None if parent_sid is None else orch.tree.by_session(parent_sid)
            _add_node(orch, sid, f, records[sid], parent, report)
            added.add(sid)
            del pending[sid]
            progressed = True
        if not progressed:  # a parent cycle can only come from damage: detach one
            sid = sorted(pending)[0]
            report.detached.append(sid)
            _add_node(orch, sid, pending.pop(sid), records[sid], None, report)
            added.add(sid)


def _cascade_terminate(
    orch: Orchestrator, sid: str, f: AgentFacts, session: Session, report: RecoveryReport
) -> None:
    assert f.created is not None
    orch.logs.get(sid).log(
        events.AGENT_TERMINATED, {"agent_id": f.created.get("agent_id"), "by": "recovery"}
    )
    orch.logs.close(sid)
    orch.store.transition(session, SessionState.TERMINATED)
    f.terminated = True
    report.cascaded.append(sid)


def _add_node(
    orch: Orchestrator,
    sid: str,
    f: AgentFacts,
    session: Session,
    parent: AgentNode | None,
    report: RecoveryReport,
) -> None:
    assert f.created is not None
    name = str(f.created.get("name"))
    parent_id = None if parent is None else parent.agent_id
    if orch.tree.name_taken(parent_id, name):
        suffix = 1
        while orch.tree.name_taken(parent_id, f"{name}-{suffix}"):
            suffix += 1
        name = f"{name}-{suffix}"
        report.detached.append(sid)
    node = AgentNode(
        agent_id=str(f.created.get("agent_id")),
        session_id=sid,
        name=name,
        parent_id=parent_id,
        instructions=str(f.created.get("instructions", "")),
        provider=session.provider,
        model=session.model,
    )
    orch.tree.add(node)
    orch.sessions[sid] = session
    orch.turn_counts[node.agent_id] = f.turn_counter
    orch.last_complete_seq[node.agent_id] = f.last_complete_seq


def _roll_forward(
    orch: Orchestrator,
    live: dict[str, AgentFacts],
    facts: dict[str, AgentFacts],
    records: dict[str, Session],
    user_facts: AgentFacts,
    held: set[str],
    report: RecoveryReport,
) -> None:
    """Finish the effects of committed turns that a crash cut short.

    Spawns first (a message may be addressed to a child spawned by another
    turn), then messages, then terminations. ``live`` and the facts are kept in
    step with what is written, so the inboxes are rebuilt without a re-read.
    """
    for node in list(orch.tree.walk()):
        for effects in _committed(live, node):
            for spawn in effects.get("spawns", []):
                child_facts = facts.get(spawn["session_id"])
                record = records.get(spawn["session_id"])
                if (child_facts is not None and child_facts.terminated) or (
                    record is not None and record.state is SessionState.TERMINATED
                ):
                    continue  # spawned, lived and was terminated since
                if spawn["session_id"] in held:
                    continue  # its files cannot be read: it comes back when they can
                if orch.materialize_child(spawn, node) is not None:
                    report.reconciled.append(f"spawn:{spawn['agent_id']}")
                    child = child_facts or AgentFacts(spawn["session_id"])
                    child.created = {"agent_id": spawn["agent_id"], "name": spawn["name"]}
                    live[spawn["session_id"]] = child
                    # a child whose agent.created was damaged may have turns already
                    orch.turn_counts[spawn["agent_id"]] = child.turn_counter
                    orch.last_complete_seq[spawn["agent_id"]] = child.last_complete_seq
    for node in list(orch.tree.walk()):
        for effects in _committed(live, node):
            for data in effects.get("messages", []):
                if not MessageEnvelope.is_valid(data):
                    continue  # a kind from a newer version: nothing here can deliver it
                recipient = data["recipient"]
                if recipient == USER:
                    target = user_facts
                elif recipient in orch.tree:
                    target = live[orch.tree.get(recipient).session_id]
                else:
                    continue  # the recipient was terminated: the message has no reader
                if data["message_id"] not in target.enqueued:
                    endpoint = USER if recipient == USER else target.session_id
                    orch.logs.get(endpoint).log(events.MESSAGE_ENQUEUED, data)
                    target.enqueued[data["message_id"]] = data
                    report.reconciled.append(f"message:{data['message_id']}")
    for node in list(orch.tree.walk()):
        if node.agent_id not in orch.tree:
            continue
        for effects in _committed(live, node):
            for agent_id in effects.get("terminations", []):
                if agent_id in orch.tree:
                    orch.terminate_now(agent_id)
                    report.reconciled.append(f"terminate:{agent_id}")


def _committed(live: dict[str, AgentFacts], node: AgentNode) -> list[dict[str, Any]]:
    f = live.get(node.session_id)
    return [] if f is None else f.committed


def _rebuild_inboxes(
    orch: Orchestrator,
    live: dict[str, AgentFacts],
    user_facts: AgentFacts,
    report: RecoveryReport,
) -> None:
    """Inboxes = enqueued minus delivered; waiting = requests with no reply yet."""
    pending: list[dict[str, Any]] = list(user_facts.pending())
    for node in orch.tree.walk():
        f = live[node.session_id]
        pending.extend(f.pending())
        replies = {m.get("reply_to") for m in f.enqueued.values() if m.get("kind") == "reply"}
        for effects in f.committed:
            for data in effects.get("messages", []):
                if (
                    data.get("kind") == "request"
                    and data.get("message_id") not in replies
                    and data.get("recipient") in orch.tree
                ):
                    node.waiting_on[data["message_id"]] = data["recipient"]
        node.state = AgentState.WAITING if node.waiting_on else AgentState.IDLE
    pending.sort(key=lambda m: (str(m.get("timestamp", "")), str(m.get("message_id"))))
    for data in pending:
        message = MessageEnvelope.from_dict(data)
        if message.recipient == USER or message.recipient in orch.tree:
            orch.inboxes.deliver(message)
            report.redelivered.append(message.message_id)


def analyze(root: str | os.PathLike[str]) -> RecoveryPlan:
    """What recovery would do, per agent, without writing anything (see recovery_plan)."""
    from substrat.recovery_plan import analyze as plan

    return plan(root)
