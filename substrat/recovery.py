"""Recovery: rebuild sessions, the tree, inboxes and conversations from the logs.

Runs when an :class:`~substrat.orchestrator.Orchestrator` opens a root:

1. ``SessionStore.recover()``: ACTIVE records become SUSPENDED (no provider
   session survives a crash); unreadable records are quarantined.
2. Every live session's log is repaired (a torn tail cut, a pending entry
   replayed) and distilled into :class:`AgentFacts` in the same single read;
   the log is left closed (it is opened for writing when first written to).
3. Records lost to damage are rebuilt from ``session.created`` and
   ``agent.created`` when the log has them.
4. The tree is rebuilt from ``agent.created`` / ``agent.terminated``. A
   session with no ``agent.created`` that no committed turn spawned is an
   orphan of a crash during ``create_root``: it is marked TERMINATED. An agent
   whose ancestor was terminated is terminated too (a cascade cut short).
5. Committed turns are rolled forward: a child their ``turn.complete`` spawned
   but that does not exist, a message it sent that the recipient's log never
   received (this is how a reply stranded in B's log reaches A), a
   termination it ordered.
6. Inboxes (the user's included) are rebuilt as enqueued minus delivered.
7. A turn started but never completed is the one lost in flight; the agent is
   told at its next turn (``resume_roots`` gives roots that turn at once).

Every step checks before it writes, so recovery is idempotent: running it
twice, or crashing during it and running it again, ends in the same state.
:func:`analyze` does the same reading without writing anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from substrat import events
from substrat.agents import USER, AgentNode, AgentState, MessageEnvelope
from substrat.eventlog import DamageReport, Entry, iter_log, repair_log
from substrat.session import Quarantined, Session, SessionState

if TYPE_CHECKING:
    from substrat.orchestrator import Orchestrator
    from substrat.recovery_plan import RecoveryPlan

RESUME_PROMPT = "Continue where you left off."
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
class AgentFacts:
    """What one log says, distilled in a single pass."""

    session_id: str
    session_created: dict[str, Any] | None = None
    created: dict[str, Any] | None = None
    terminated: bool = False
    enqueued: dict[str, dict[str, Any]] = field(default_factory=dict)
    delivered: set[str] = field(default_factory=set)
    committed: list[dict[str, Any]] = field(default_factory=list)
    """The ``effects`` of every completed turn that spawned, sent or terminated
    something, in order (turns with none of these have nothing to roll forward;
    keeping only these keeps a long log's facts small)."""
    turn_starts: int = 0
    completed_turns: int = 0
    last_complete_seq: int = 0
    last_complete: dict[str, Any] | None = None
    open_turns: dict[str, str] = field(default_factory=dict)
    """The turn started and neither completed nor failed (one turn at a time per
    agent, so at most the newest one)."""
    lost_notice: dict[str, Any] | None = None
    """A turn an earlier recovery closed as lost, not yet followed by a completed one:
    the agent has still to be told about it."""
    entries: int = 0
    damage: dict[str, int] = field(default_factory=dict)

    @property
    def lost_turn(self) -> dict[str, Any] | None:
        if not self.open_turns:
            return None
        turn_id, prompt = list(self.open_turns.items())[-1]
        return {"turn_id": turn_id, "prompt": prompt}

    def pending(self) -> list[dict[str, Any]]:
        return [m for i, m in self.enqueued.items() if i not in self.delivered]

    def add_all(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            self.add(entry)

    def add(self, entry: Entry) -> None:
        """Fold one log entry (in file order) into the facts."""
        self.entries += 1
        event = entry.get("event")
        data = entry.get("data")
        if type(data) is not dict:
            return
        if event == events.TURN_START:
            self.turn_starts += 1
            # a newer start means any older open turn was lost (and closed) before it
            self.open_turns = {str(data.get("turn_id")): str(data.get("prompt", ""))}
        elif event == events.TURN_COMPLETE:
            turn_id = str(data.get("turn_id"))
            prompt = self.open_turns.pop(turn_id, "")
            effects = data.get("effects") or {}
            if effects.get("spawns") or effects.get("messages") or effects.get("terminations"):
                self.committed.append(effects)
            delivered = effects.get("delivered")
            if delivered:
                self.delivered.update(str(i) for i in delivered)
            self.completed_turns += 1
            self.lost_notice = None
            self.last_complete_seq = int(entry["seq"])
            self.last_complete = {
                "turn_id": turn_id,
                "prompt": prompt,
                "response": data.get("response", ""),
            }
        elif event == events.MESSAGE_ENQUEUED:
            if MessageEnvelope.is_valid(data):
                self.enqueued[str(data["message_id"])] = data
            else:
                self.damage["unreadable_message"] = self.damage.get("unreadable_message", 0) + 1
        elif event == events.MESSAGE_DELIVERED:
            ids = data.get("message_ids") or [data.get("message_id")]
            self.delivered.update(str(i) for i in ids if i)
        elif event == events.TURN_FAILED:
            prompt = self.open_turns.pop(str(data.get("turn_id")), "")
            if data.get("lost"):
                self.lost_notice = {
                    "turn_id": str(data.get("turn_id")),
                    "prompt": str(data.get("prompt", prompt)),
                }
        elif event == events.AGENT_CREATED:
            self.created = data
        elif event == events.SESSION_CREATED:
            self.session_created = data
        elif event == events.AGENT_TERMINATED:
            self.terminated = True


def collect_facts(session_id: str, entries: Iterable[Entry]) -> AgentFacts:
    facts = AgentFacts(session_id)
    for entry in entries:
        facts.add(entry)
    return facts


def read_facts(session_id: str, path: Path) -> AgentFacts:
    damage = DamageReport()
    facts = collect_facts(session_id, iter_log(path, damage))
    facts.damage.update(damage.counts())
    return facts


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
    records = {s.session_id: s for s in scan.sessions}
    candidates = [sid for sid, s in records.items() if s.state is not SessionState.TERMINATED]
    candidates += scan.missing_records
    candidates += [q.name for q in scan.quarantined if q.kind != "bad_name"]

    facts: dict[str, AgentFacts] = {}
    for sid in sorted(set(candidates)):
        path = orch.logs.path(sid)
        if not os.path.exists(path):
            continue
        orch.logs.close(sid)  # the repair below must be the only open of this log
        collected = AgentFacts(sid)
        opened = repair_log(path, collected.add_all)
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
        collected.damage.update(opened.kept_damage().counts())
        facts[sid] = collected
        report.events_read += collected.entries
        if facts[sid].damage:
            report.log_damage[sid] = facts[sid].damage

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
        elif (f is None or f.created is None) and sid not in spawned:
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
    _build_tree(orch, live, records, facts, report)
    user_log = orch.logs.path(USER)
    user_facts = AgentFacts(USER)
    if os.path.exists(user_log.parent):
        orch.logs.close(USER)
        # repaired and replayed in the same read that collects it, like every other log
        user_facts.damage.update(repair_log(user_log, user_facts.add_all).kept_damage().counts())
    report.events_read += user_facts.entries
    _roll_forward(orch, live, facts, records, user_facts, report)
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
    report.agents = len(orch.tree)
    report.roots = len(orch.tree.roots())
    orch.tree.check()
    return report


def _build_tree(
    orch: Orchestrator,
    live: dict[str, AgentFacts],
    records: dict[str, Session],
    facts: dict[str, AgentFacts],
    report: RecoveryReport,
) -> None:
    """Add live agents parents first; cascade terminations that a crash cut short."""
    added: set[str] = set()
    pending = dict(live)
    while pending:
        progressed = False
        for sid, f in sorted(pending.items()):
            assert f.created is not None
            parent_sid = f.created.get("parent_session_id")
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
    orch.turn_counts[node.agent_id] = f.turn_starts
    orch.last_complete_seq[node.agent_id] = f.last_complete_seq


def _roll_forward(
    orch: Orchestrator,
    live: dict[str, AgentFacts],
    facts: dict[str, AgentFacts],
    records: dict[str, Session],
    user_facts: AgentFacts,
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
                if orch.materialize_child(spawn, node) is not None:
                    report.reconciled.append(f"spawn:{spawn['agent_id']}")
                    child = child_facts or AgentFacts(spawn["session_id"])
                    child.created = {"agent_id": spawn["agent_id"], "name": spawn["name"]}
                    live[spawn["session_id"]] = child
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
