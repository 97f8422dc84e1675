"""Recovery: from the disk to a recovered state that the orchestrator applies.

:func:`recover` runs when an :class:`~substrat.orchestrator.Orchestrator`
opens a root. It takes the root's stores (records, logs, the root registry),
imports nothing of the orchestrator, and returns a :class:`Recovered` value:
the tree of live agents with their sessions and turn counters, and the
roll-forward plan (:mod:`substrat.rollforward`) that the orchestrator applies
with its own commit code (:mod:`substrat.restore`).

1. ``SessionStore.recover()``: ACTIVE records become SUSPENDED (no provider
   session survives a crash); corrupt records are quarantined. A record that
   cannot be read at all (EACCES, EIO) is left alone: that agent is held back
   (see step 7).
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
6. The roll-forward is planned (committed turns' children, messages and
   terminations a crash cut short; the turns lost in flight; inboxes as
   enqueued minus delivered; requests still waiting for a reply).
7. Agents held back (``unreadable``: their files failed, or an ancestor's did)
   are not served and nothing of theirs is written; the report says what to do
   (:mod:`substrat.access`), and they come back at the next start once fixed.

Every step checks before it writes, so recovery is idempotent: running it
twice, or crashing during it and running it again, ends in the same state.
:func:`analyze` does the same reading without writing anything.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from substrat import access, events, rollforward
from substrat.access import Unreadable
from substrat.agents import USER, AgentNode, AgentTree
from substrat.checkpoints import CHECKPOINTS_DIR, Checkpoint, StoreRead, read_store, verify
from substrat.eventlog import PENDING_NAME, DamageReport, Resume, is_suspect, repair_log
from substrat.events import KNOWN_EVENTS
from substrat.facts import AgentFacts as AgentFacts
from substrat.facts import collect_facts as collect_facts
from substrat.facts import read_facts as read_facts
from substrat.logread import sealed_batches
from substrat.logs import LogPool
from substrat.registry import (
    REGISTRY_DIR,
    RegistryRead,
    RootRegistry,
    creation_from_registry,
    lost_root,
    quarantined_sessions,
    root_entry,
)
from substrat.rollforward import RollForward
from substrat.segments import Position, Segment, active_first, list_sealed
from substrat.session import Quarantined, Session, SessionState, SessionStore

if TYPE_CHECKING:
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
    checkpoints_used: int = 0
    """Logs read from a checkpoint on (only the entries after it were read)."""
    checkpoints_rejected: dict[str, str] = field(default_factory=dict)
    """Endpoint -> why its checkpoint did not hold against its log (that log was read
    from its start instead: see substrat.checkpoints)."""
    read_in_full: list[str] = field(default_factory=list)
    """Endpoints whose log was read from its start (no checkpoint of it held)."""

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
        }


@dataclass
class Recovered:
    """What the disk says, ready to serve: the live tree and what is left to finish."""

    report: RecoveryReport
    tree: AgentTree
    sessions: dict[str, Session]
    """Session id -> record, for every agent in ``tree``."""
    facts: dict[str, AgentFacts]
    """Session id -> facts, for every agent in ``tree`` (turn counters, last commits)."""
    plan: RollForward
    checkpoints: StoreRead
    """The checkpoint store as recovery read it."""
    checkpointed: dict[str, Checkpoint] = field(default_factory=dict)
    """Endpoint -> the checkpoint its facts were read from (one that held against its log)."""


@dataclass
class _Root:
    """The stores of one root that recovery reads and repairs."""

    store: SessionStore
    logs: LogPool
    roots: RootRegistry
    checkpoints: StoreRead
    used: dict[str, Checkpoint] = field(default_factory=dict)


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


def recover(store: SessionStore, logs: LogPool, roots: RootRegistry) -> Recovered:
    """Repair the root and say what it holds (see the module docstring). Idempotent.

    The cyclic garbage collector is paused meanwhile: recovery builds a few
    objects per agent that all stay alive, so its passes over an ever larger
    heap (about a fifth of a 10,000-agent start) would free nothing.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        return _recover(store, logs, roots)
    finally:
        if paused:
            gc.enable()


def _recover(store: SessionStore, logs: LogPool, roots: RootRegistry) -> Recovered:
    root = _Root(store, logs, roots, read_store(store.root))
    report = RecoveryReport()
    if root.checkpoints.damage:
        report.log_damage[CHECKPOINTS_DIR] = dict(root.checkpoints.damage)
    scan = store.recover()
    report.quarantined = list(scan.quarantined)
    unreadable = {
        sid: access.unreadable(sid, store.session_dir(sid), exc, then=THEN)
        for sid, exc in scan.unreadable.items()
    }
    registry = roots.load()
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
        read = _read_agent(root, sid, report)
        if isinstance(read, Unreadable):
            unreadable[sid] = read
        elif read is not None:
            facts[sid] = read
    for sid in unreadable:
        records.pop(sid, None)
    candidates = [sid for sid in candidates if sid not in unreadable]

    _check_registered(root, registry, directories, candidates, facts, unreadable, report)

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
    tree = AgentTree()
    _build_tree(root, tree, live, records, facts, unreadable, report)
    for sid in report.creations_rebuilt:
        if sid in live:
            created = live[sid].created
            assert created is not None
            logs.get(sid).log(events.AGENT_CREATED, created)
    _register_roots(root, tree, live, registry, report)
    user_facts = _read_user(root, report)
    held = set(unreadable)
    in_tree = {node.session_id: live[node.session_id] for node in tree.walk()}
    plan = rollforward.plan(tree, in_tree, facts, records, user_facts, held)
    names = {sid: str(data.get("name")) for sid, data in registry.roots.items()}
    report.unreadable = access.named(unreadable, names)
    sessions = {sid: records[sid] for sid in in_tree}
    return Recovered(report, tree, sessions, in_tree, plan, root.checkpoints, root.used)


def _read_agent(root: _Root, sid: str, report: RecoveryReport) -> AgentFacts | Unreadable | None:
    """Repair one agent's log and distill it; None if it has no log, Unreadable if it failed."""
    path = root.logs.path(sid)
    try:
        os.stat(path)
    except FileNotFoundError:
        if not list_sealed(path):
            return None
        # a crash between sealing the active file and creating the next one: the
        # log is its segments (opening it creates the active file)
    except OSError as exc:
        return access.unreadable(sid, path, exc, then=THEN)
    root.logs.close(sid)  # the repair below must be the only open of this log
    try:
        collected = _read_log(root, sid, path, report)
    except OSError as exc:  # EACCES, EIO, a failed fsync: it costs this agent only
        return access.unreadable(sid, path, exc, then=THEN)
    except HistoryGone as gone:  # nothing that holds says what the missing part held
        return access.history_gone(sid, path, gone.first, then=THEN)
    if collected.damage:
        report.log_damage[sid] = collected.damage
    return collected


def _read_log(root: _Root, endpoint: str, path: Path, report: RecoveryReport) -> AgentFacts:
    """An endpoint's facts: from its newest checkpoint that holds, the log after it
    (repaired); without one, the whole log, repaired in the same read."""
    unsealed = _unsealed_to_the_end(root, endpoint, path, report)
    if unsealed is not None:
        return unsealed
    sealed = list_sealed(path)
    checkpoint, facts = _usable_checkpoint(root, endpoint, path, sealed, report)
    if checkpoint is not None:
        end = _checkpointed_end(checkpoint, path, sealed)
        if end is not None:  # the log ends where its checkpoint does: nothing to read
            root.logs.remember(endpoint, end)
            return facts
    damage = DamageReport()
    resume: Resume | None = None
    start: Position | None = None
    carried = None
    floor = 0
    if checkpoint is not None:
        carried = facts.ceiling()
        start = checkpoint.at.after()
        floor = checkpoint.at.seq
    elif sealed and sealed[0].first > 1:
        raise HistoryGone(sealed[0].first)
    elif sealed:
        start = Position(sealed[0].first, 0)
    if start is not None and start.file_first == active_first(sealed):
        resume = Resume(start.offset, floor)
    elif start is not None:  # the sealed segments (from the checkpoint's on) first
        for batch in sealed_batches(path, start, damage, KNOWN_EVENTS, set(), floor):
            facts.add_all(batch)
    opened = repair_log(path, facts.add_all, resume)
    kept = opened.kept_damage()
    damage.items.extend(kept.items)
    damage.unknown_events.extend(kept.unknown_events)
    facts.count_damage(path, damage, start, carried)
    cut_starts = [
        item.started_turn
        for item in opened.damage.items
        if item.offset >= opened.valid_end and item.started_turn is not None
    ]
    if cut_starts:
        facts.cut_turn_start(max(cut_starts))
    if (
        opened.truncated_bytes
        or opened.pending_replayed
        or opened.pending_discarded
        not in (
            None,
            "already_logged",  # the normal leftover of a crash after a durable append
        )
    ):
        report.log_repairs[endpoint] = {
            "truncated_bytes": opened.truncated_bytes,
            "pending_replayed": opened.pending_replayed,
            "pending_discarded": opened.pending_discarded,
        }
    for kind, count in damage.counts().items():
        facts.damage[kind] = facts.damage.get(kind, 0) + count
    report.events_read += facts.entries
    root.logs.remember(endpoint, opened.resume())
    return facts


class HistoryGone(Exception):
    """A log whose first segments are missing (removed by hand), with no checkpoint
    that holds for it: what they said is known nowhere."""

    def __init__(self, first: int) -> None:
        super().__init__(first)
        self.first = first


def _unsealed_to_the_end(
    root: _Root, endpoint: str, path: Path, report: RecoveryReport
) -> AgentFacts | None:
    """The facts of a log never sealed whose newest checkpoint ends at its last byte,
    without listing its directory (most logs of a root with many agents); None for
    any other log, which :func:`_read_log` then lists and reads as always.

    The checkpoint is checked as ever (:func:`~substrat.checkpoints.verify`), taking
    the active file as the file its entry must be in: had the log been sealed since,
    that file would hold another entry there, or none.
    """
    newest = root.checkpoints.latest(endpoint)
    if not newest or newest[0].at.file_first != 1 or verify(newest[0], path, []) is not None:
        return None
    checkpoint = newest[0]
    end = _checkpointed_end(checkpoint, path, [])
    if end is None:
        return None
    try:
        facts = checkpoint.load_facts()
    except ValueError:
        return None  # said by the full path, which tries it again
    checkpoint.release()
    report.checkpoints_used += 1
    root.used[endpoint] = checkpoint
    root.logs.remember(endpoint, end)
    return facts


def _checkpointed_end(checkpoint: Checkpoint, path: Path, sealed: list[Segment]) -> Resume | None:
    """Where the log ends if it ends with the (verified) checkpoint's last entry, with
    nothing after it to read or repair: no byte past it, no pending entry, no failed
    append of this process to take back, and the file writable. None otherwise (the
    log is then opened and repaired from the checkpoint on, as always, and a log that
    cannot be opened for writing holds its agent back)."""
    at = checkpoint.at
    if is_suspect(path):
        return None
    try:
        size = os.stat(path).st_size
        if at.file_first == active_first(sealed):
            ends_there = size == at.offset + at.length
        elif not sealed:
            return None  # it names a segment the log does not have
        else:  # sealed right after the checkpoint: it ends its last segment, nothing after
            last = sealed[-1]
            ends_there = (
                size == 0
                and at.file_first == last.first
                and at.seq == last.last
                and not last.archived  # an archive's length is not known without reading it
                and os.stat(last.path).st_size == at.offset + at.length
            )
    except FileNotFoundError:
        return None
    pending = os.path.join(os.path.dirname(path), PENDING_NAME)
    if not ends_there or os.path.lexists(pending):
        return None
    if not os.access(path, os.W_OK):  # the repair's open for writing would fail: it says why
        return None
    return Resume(size, at.seq)


def _usable_checkpoint(
    root: _Root, endpoint: str, path: Path, sealed: list[Segment], report: RecoveryReport
) -> tuple[Checkpoint | None, AgentFacts]:
    """The endpoint's newest checkpoint that holds against its log, with its facts."""
    for checkpoint in root.checkpoints.latest(endpoint):
        reason = verify(checkpoint, path, sealed)
        if reason is None:
            try:
                facts = checkpoint.load_facts()
            except ValueError as exc:
                reason = f"its facts do not read ({exc})"
            else:
                checkpoint.release()
                report.checkpoints_used += 1
                root.used[endpoint] = checkpoint
                return checkpoint, facts
        report.checkpoints_rejected.setdefault(endpoint, reason)
    report.read_in_full.append(endpoint)
    return None, AgentFacts(endpoint)


def _read_user(root: _Root, report: RecoveryReport) -> AgentFacts:
    """The user's log, read like an agent's (from its checkpoint, repaired)."""
    user_log = root.logs.path(USER)
    if not os.path.exists(user_log.parent):
        return AgentFacts(USER)
    root.logs.close(USER)
    return _read_log(root, USER, user_log, report)


def _check_registered(
    root: _Root,
    registry: RegistryRead,
    directories: set[str],
    candidates: list[str],
    facts: dict[str, AgentFacts],
    unreadable: dict[str, Unreadable],
    report: RecoveryReport,
) -> None:
    """Registered roots whose directory or log is gone are lost; an unreadable
    ``agent.created`` of a registered root is rebuilt from the registry."""
    gone = quarantined_sessions(root.store)
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


def _register_roots(
    root: _Root,
    tree: AgentTree,
    live: dict[str, AgentFacts],
    registry: RegistryRead,
    report: RecoveryReport,
) -> None:
    """Register every live root the registry lacks (the tree stays built from the logs)."""
    if registry.problem is not None:
        return  # reported; nothing can be written to it
    for node in tree.roots():
        created = live[node.session_id].created
        assert created is not None
        if created.get("parent_session_id") is None and node.session_id not in registry.roots:
            root.roots.register(root_entry(node))
            report.roots_registered.append(node.session_id)


def _build_tree(
    root: _Root,
    tree: AgentTree,
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
                where = root.store.session_dir(sid)
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
                    _cascade_terminate(root, sid, f, records[sid], report)
                    del pending[sid]
                    progressed = True
                    continue
                if parent_sid in pending:
                    continue  # its parent is added first
                report.detached.append(sid)
                parent_sid = None
            parent = None if parent_sid is None else tree.by_session(parent_sid)
            _add_node(tree, sid, f, records[sid], parent, report)
            added.add(sid)
            del pending[sid]
            progressed = True
        if not progressed:  # a parent cycle can only come from damage: detach one
            sid = sorted(pending)[0]
            report.detached.append(sid)
            _add_node(tree, sid, pending.pop(sid), records[sid], None, report)
            added.add(sid)


def _cascade_terminate(
    root: _Root, sid: str, f: AgentFacts, session: Session, report: RecoveryReport
) -> None:
    assert f.created is not None
    root.logs.get(sid).log(
        events.AGENT_TERMINATED, {"agent_id": f.created.get("agent_id"), "by": "recovery"}
    )
    root.logs.close(sid)
    root.store.transition(session, SessionState.TERMINATED)
    f.terminated = True
    report.cascaded.append(sid)


def _add_node(
    tree: AgentTree,
    sid: str,
    f: AgentFacts,
    session: Session,
    parent: AgentNode | None,
    report: RecoveryReport,
) -> None:
    assert f.created is not None
    name = str(f.created.get("name"))
    parent_id = None if parent is None else parent.agent_id
    if tree.name_taken(parent_id, name):
        suffix = 1
        while tree.name_taken(parent_id, f"{name}-{suffix}"):
            suffix += 1
        name = f"{name}-{suffix}"
        report.detached.append(sid)
    tree.add(
        AgentNode(
            agent_id=str(f.created.get("agent_id")),
            session_id=sid,
            name=name,
            parent_id=parent_id,
            instructions=str(f.created.get("instructions", "")),
            provider=session.provider,
            model=session.model,
        )
    )


def analyze(root: str | os.PathLike[str]) -> RecoveryPlan:
    """What recovery would do, per agent, without writing anything (see recovery_plan)."""
    from substrat.recovery_plan import analyze as plan

    return plan(root)
