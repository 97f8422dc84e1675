"""Recovery: from the disk to a recovered state that the orchestrator applies.

:func:`recover` runs when an :class:`~substrat.orchestrator.Orchestrator`
opens a root. It takes the root's stores (records, logs, the root registry),
imports nothing of the orchestrator, and returns a :class:`Recovered` value:
the tree of live agents with their sessions and turn counters, and the
roll-forward plan (:mod:`substrat.rollforward`) that the orchestrator applies
with its own commit code (:mod:`substrat.restore`).

1. ``SessionStore.recover()``: ACTIVE records (only an older substrat wrote
   them: see ``SessionStore.activate``) become SUSPENDED (no provider session
   survives a crash); corrupt records are quarantined. A record that
   cannot be read at all (EACCES, EIO) is left alone: that agent is held back
   (see step 7). The record of a session with a terminated marker
   (``terminated/<id>``) is not read: the marker stands for it. A quiet agent
   of the start summary is taken whole in the same pass, its files checked
   (:mod:`substrat.recovery_quiet`): the steps below see it only in the tree and
   the turn counters, unless it has to be treated otherwise (then it is demoted).
2. Every live session's log is repaired (a torn tail cut, a pending entry
   replayed) and distilled into :class:`~substrat.facts.AgentFacts` in the
   same single read, or read from its newest checkpoint that holds
   (:mod:`substrat.recovery_logs`); the log is left closed (it is opened for
   writing when first written to). A log that cannot be read or repaired holds its agent
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

import contextlib
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from substrat import access, events, incidents, rollforward, rootmarker, start_summary
from substrat.access import Unreadable
from substrat.agents import AgentNode, AgentTree
from substrat.checkpoints import CHECKPOINTS_DIR, Checkpoint, StoreRead, read_store
from substrat.errors import NameCollisionError
from substrat.facts import AgentFacts as AgentFacts
from substrat.facts import collect_facts as collect_facts
from substrat.facts import read_facts as read_facts
from substrat.lazy import LazyDict
from substrat.logread import describe_gaps
from substrat.logs import LogPool
from substrat.lost_notice import lost_turn_notice as lost_turn_notice
from substrat.recovery_logs import THEN as THEN
from substrat.recovery_logs import RootStores, read_agent
from substrat.recovery_quiet import LiveFacts, QuietAgents
from substrat.recovery_report import RecoveryReport as RecoveryReport
from substrat.recovery_user import DeferredUser, for_plan, read_user
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
from substrat.session import Session, SessionState, SessionStore

if TYPE_CHECKING:
    from substrat.recovery_plan import RecoveryPlan

RESUME_PROMPT = "Continue where you left off."


@dataclass
class Recovered:
    """What the disk says, ready to serve: the live tree and what is left to finish."""

    report: RecoveryReport
    tree: AgentTree
    sessions: dict[str, Session]
    """Session id -> record, for every agent in ``tree``."""
    facts: LiveFacts
    """Session id -> facts, for every agent in ``tree`` (turn counters, last commits): a
    quiet agent's built when first asked for (see :mod:`substrat.recovery_quiet`)."""
    plan: RollForward
    checkpoints: StoreRead
    """The checkpoint store as recovery read it."""
    checkpointed: dict[str, Checkpoint] = field(default_factory=dict)
    """Endpoint -> the checkpoint its facts were read from (one that held against its log)."""
    summarized: list[str] = field(default_factory=list)
    """Endpoints whose facts came from the start summary: the checkpoint each was read
    from is its newest in ``checkpoints`` (built when first asked for)."""
    deferred_user: DeferredUser | None = None
    """The user's checkpointed messages, decoded when its inbox is first read
    (:mod:`substrat.recovery_user`)."""
    unbuilt: dict[str, list[Any]] = field(default_factory=dict)
    """Agent id -> the summary's row of each agent whose node ``tree`` builds when first
    asked for (its counters are built from the row the same way: see restore.apply)."""


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


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector meanwhile (as it was before, after).

    A start builds a few objects per agent that all stay alive, so the
    collector's passes over an ever larger heap (about a fifth of a
    10,000-agent start, recovery's and the orchestrator's applying of it alike)
    would free nothing.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def recover(store: SessionStore, logs: LogPool, roots: RootRegistry) -> Recovered:
    """Repair the root and say what it holds (see the module docstring). Idempotent.

    The cyclic garbage collector is paused meanwhile (see :func:`gc_paused`).
    """
    with gc_paused():
        report = RecoveryReport()
        summary, report.start_summary = start_summary.load(store.root)
        try:
            # before the first write: while a summary exists nothing has written to
            # the root since the clean stop that wrote it (see substrat.start_summary)
            start_summary.retire(store.root)
            # and a root an older version marked as its own is marked as this one's, so
            # that version refuses it rather than misread what this one writes
            rootmarker.upgrade(store.root)
            return _recover(store, logs, roots, report, summary)
        finally:
            if summary is not None:
                summary.close()


def _recover(
    store: SessionStore,
    logs: LogPool,
    roots: RootRegistry,
    report: RecoveryReport,
    summary: start_summary.Summary | None,
) -> Recovered:
    quiet = QuietAgents(summary, logs)
    if summary is not None:  # the store as it was summarised: none of its lines is read
        root = RootStores(store, logs, roots, summary.store, summary=summary)
    else:
        root = RootStores(store, logs, roots, read_store(store.root))
    if root.checkpoints.damage:
        report.log_damage[CHECKPOINTS_DIR] = dict(root.checkpoints.damage)
    # the quiet agents are taken whole in the scan's pass (see substrat.recovery_quiet)
    scan = store.recover() if summary is None else store.recover(summary.record, quiet.vouch)
    quiet.finish()
    if quiet:  # each one's facts came from the summary, as _from_summary counts them
        report.checkpoints_used += len(quiet)
        report.summary_used += len(quiet)
        root.summarized.extend(quiet.rows)
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
    for sid in scan.terminated:
        # a marked session's record was not read: all recovery asks of a terminated
        # session's record is its state (whether a parent is dead, a spawn undone)
        records[sid] = Session(sid, provider="", model="", state=SessionState.TERMINATED)
    directories = set(records) | set(scan.missing_records) | set(scan.unreadable)
    directories |= {q.name for q in scan.quarantined if q.is_session}
    candidates = [sid for sid, s in records.items() if s.state is not SessionState.TERMINATED]
    candidates += scan.missing_records
    candidates += [q.name for q in scan.quarantined if q.is_session]

    facts, user_facts, failed = _read_endpoints(root, sorted(set(candidates)), records, report)
    _note_incidents(root, report)  # before anything rewrites the checkpoints that tell them
    doubt = _checkpoints_in_doubt(report)
    if doubt is not None:
        # Another log's checkpoint may count on what this log lost: a sender's
        # checkpoint forgets the messages its turns sent once they are in their
        # recipients' logs, so only the sender's log still says they were sent.
        # Read every log without the store, as if it were gone (bases still count).
        report.checkpoints_set_aside = doubt
        report.checkpoints_used = report.summary_used = 0
        report.read_in_full.clear()
        for sid in list(quiet.rows):  # read as every other log, from their records on
            records[sid], _ = quiet.demote(sid)
            directories.add(sid)
            candidates.append(sid)
        every_log = RootStores(store, logs, roots, StoreRead())
        every_log.cut_turn_starts = root.cut_turn_starts  # that repair is done
        facts, user_facts, failed = _read_endpoints(
            every_log, sorted(set(candidates)), records, report
        )
        root.used, root.summarized = every_log.used, every_log.summarized
    unreadable.update(failed)
    for sid in unreadable:
        records.pop(sid, None)
    candidates = [sid for sid in candidates if sid not in unreadable]

    _check_registered(root, registry, directories, quiet, candidates, facts, unreadable, report)

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
    # most agents: live in their record and their log alike, nothing to write (only the
    # others are sorted, for the order of the writes and the report)
    for sid in sorted(sid for sid, s in records.items() if _maybe_ended(s, facts.get(sid))):
        session = records[sid]
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
    _build_tree(root, tree, live, quiet, records, facts, unreadable, report)
    for sid in report.creations_rebuilt:
        if sid in live:
            created = live[sid].created
            assert created is not None
            logs.get(sid).log(events.AGENT_CREATED, created)
    _register_roots(root, tree, live, quiet, registry, report)
    held = set(unreadable)
    built = {sid: f for sid, f in live.items() if tree.by_session(sid) is not None}
    in_tree = LiveFacts(built, quiet.rows)
    user, deferred = for_plan(user_facts, facts)
    plan = rollforward.plan(tree, in_tree, facts, records, user, held)
    names = {sid: str(data.get("name")) for sid, data in registry.roots.items()}
    report.unreadable = access.named(unreadable, names)
    # a quiet agent's record is built when first asked for (see substrat.lazy)
    sessions = LazyDict(
        {sid: records[sid] for sid in built}, quiet.fields, start_summary.session_of
    )
    return Recovered(
        report,
        tree,
        sessions,
        in_tree,
        plan,
        root.checkpoints,
        root.used,
        root.summarized,
        deferred,
        quiet.unbuilt,
    )


def _note_incidents(root: RootStores, report: RecoveryReport) -> None:
    """Record each log found shorter than its checkpoint (durably, see
    :mod:`substrat.incidents`), and report every incident not acknowledged yet."""
    where = root.store.root
    found = incidents.behind_in_recovery(where, root.checkpoints, report.checkpoints_rejected)
    read = incidents.record(where, found, f"recovery (pid {os.getpid()})")
    report.incidents = [i.to_dict() for i in read.open()]
    if read.damage:
        report.log_damage[incidents.INCIDENTS_DIR] = dict(read.damage)


def _maybe_ended(session: Session, f: AgentFacts | None) -> bool:
    """Whether a live record may have to be marked TERMINATED (its log says so, or it
    may be an orphan: see :func:`_recover`)."""
    if session.state is SessionState.TERMINATED:
        return False
    return f is None or f.terminated or f.created is None


def _read_endpoints(
    root: RootStores, sids: list[str], records: dict[str, Session], report: RecoveryReport
) -> tuple[dict[str, AgentFacts], AgentFacts | DeferredUser, dict[str, Unreadable]]:
    """Every candidate agent's facts, the user's, and the agents whose log failed."""
    facts: dict[str, AgentFacts] = {}
    failed: dict[str, Unreadable] = {}
    for sid in sids:
        read = read_agent(root, sid, report, recorded=sid in records)
        if isinstance(read, Unreadable):
            failed[sid] = read
        elif read is not None:
            facts[sid] = read
            if sid in root.cut_turn_starts:  # cut by an earlier read's repair
                read.cut_turn_start(root.cut_turn_starts[sid])
            if read.created is not None and sid in records:
                # what it says is in the record: it is read again only to rebuild a lost
                # record, or a lost agent.created (3 MiB of a 10,000-agent start's peak)
                read.session_created = None
    return facts, read_user(root, report), failed


def _checkpoints_in_doubt(report: RecoveryReport) -> str | None:
    """Why the store's checkpoints cannot all be trusted together, if they cannot.

    A checkpoint is checked against its own log only, but it also counts on the
    other logs: it forgets what its agent sent once the recipients logged it.
    So when a log is not what its checkpoint says (rejected), or lost entries to
    damage, the checkpoints of the others may have forgotten what only they could
    say. Torn tails are no such loss: nothing counts on an entry before it is
    durable, but a whole line cut off a log's end may have been an acknowledged entry
    damaged since. Nor is a line removed whole from a log's middle (a ``seq`` gap in
    the part read after its checkpoint, or in a log read in full): it leaves no
    damaged byte, only its missing number. A gap that a checkpoint covers was there
    when the checkpoint was written (it held against its log), so it is not seen;
    ``fsck --repair``'s quarantine leaves gaps too, but drops every checkpoint and
    its clean shutdown writes new ones that cover them, so they cost no later start
    a full read.
    """
    if report.checkpoints_used == 0:
        return None  # nothing was read from the store: there is nothing to set aside
    for endpoint, why in sorted(report.checkpoints_rejected.items()):
        return f"the checkpoint of {endpoint} did not hold against its log ({why})"
    for endpoint, gaps in sorted(report.log_gaps.items()):
        return f"{describe_gaps(gaps, shown=5)} from the log of {endpoint} (removed whole)"
    for endpoint, damage in sorted(report.log_damage.items()):
        if endpoint in (CHECKPOINTS_DIR, REGISTRY_DIR, incidents.INCIDENTS_DIR):
            continue  # the store's or the registry's own lines: no log lost anything
        lost = sorted(kind for kind in damage if kind != "torn_tail")
        if lost:
            return f"the log of {endpoint} is damaged ({', '.join(lost)})"
    for endpoint, repairs in sorted(report.log_repairs.items()):
        if repairs.get("whole_lines_cut"):
            return f"a damaged whole line was cut off the end of the log of {endpoint}"
    return None


def _check_registered(
    root: RootStores,
    registry: RegistryRead,
    directories: set[str],
    quiet: QuietAgents,
    candidates: list[str],
    facts: dict[str, AgentFacts],
    unreadable: dict[str, Unreadable],
    report: RecoveryReport,
) -> None:
    """Registered roots whose directory or log is gone are lost; an unreadable
    ``agent.created`` of a registered root is rebuilt from the registry."""
    gone = quarantined_sessions(root.store)
    candidate = set(candidates)
    for sid, data in sorted(registry.roots.items()):
        if sid in quiet:
            continue  # its record, log and agent.created are there, as the summary says
        if sid not in directories:
            if sid not in gone:
                report.lost_roots.append(lost_root(data))
            continue
        if sid in unreadable or sid not in candidate:
            continue  # held back, or terminated
        root_facts = facts.get(sid)
        if root_facts is None:  # its log is gone: as lost as a missing directory
            report.lost_roots.append(lost_root(data, what="events.jsonl"))
            continue
        if root_facts.created is None and not root_facts.terminated:
            creation_from_registry(root_facts, data)
            report.creations_rebuilt.append(sid)


def _register_roots(
    root: RootStores,
    tree: AgentTree,
    live: dict[str, AgentFacts],
    quiet: QuietAgents,
    registry: RegistryRead,
    report: RecoveryReport,
) -> None:
    """Register every live root the registry lacks (the tree stays built from the logs)."""
    if registry.problem is not None:
        return  # reported; nothing can be written to it
    for node in tree.roots():
        sid = node.session_id
        created = quiet.created(sid) if sid in quiet else live[sid].created
        assert created is not None
        if created.get("parent_session_id") is None and node.session_id not in registry.roots:
            root.roots.register(root_entry(node))
            report.roots_registered.append(node.session_id)


def _build_tree(
    root: RootStores,
    tree: AgentTree,
    live: dict[str, AgentFacts],
    quiet: QuietAgents,
    records: dict[str, Session],
    facts: dict[str, AgentFacts],
    unreadable: dict[str, Unreadable],
    report: RecoveryReport,
) -> None:
    """Add live agents (the quiet ones too) parents first; cascade terminations that a
    crash cut short.

    A descendant of an unreadable agent is held back with it (added to
    ``unreadable``): where it belongs, and whether a cascade reached it, is in
    the log that cannot be read. A quiet agent that is held back or terminated is
    demoted first (see :mod:`substrat.recovery_quiet`): then it is in ``records``,
    ``facts`` and ``live`` as every other agent.
    """

    def demote(sid: str) -> None:
        if sid in quiet:
            records[sid], f = quiet.demote(sid)
            facts[sid] = live[sid] = f

    placed: dict[str, str] = {}  # session id -> its agent id, once in the tree
    pending: dict[str, dict[str, Any]] = {}
    for sid, f in live.items():
        assert f.created is not None
        pending[sid] = f.created
    rows, unbuilt, add_unbuilt = quiet.rows, quiet.unbuilt, tree.add_unbuilt
    for sid, row in rows.items():
        pending[sid] = row[0]
    while pending:
        progressed = False
        for sid, created in sorted(pending.items()):
            parent_sid = created.get("parent_session_id")
            if parent_sid is None:
                parent = None
            elif parent_sid in placed:  # most agents of a large tree: their parent is in
                parent = placed[parent_sid]
            elif parent_sid in unreadable:
                demote(sid)
                ancestor = unreadable[parent_sid].held_by or parent_sid
                where = root.store.session_dir(sid)
                name = str(created.get("name"))
                unreadable[sid] = access.held(sid, where, ancestor, then=THEN, name=name)
                del pending[sid]
                progressed = True
                continue
            else:
                parent_facts = facts.get(parent_sid)
                parent_dead = (parent_facts is not None and parent_facts.terminated) or (
                    parent_sid in records
                    and records[parent_sid].state is SessionState.TERMINATED
                    and parent_sid not in live
                )
                if parent_dead:
                    demote(sid)
                    _cascade_terminate(root, sid, live[sid], records[sid], report)
                    del pending[sid]
                    progressed = True
                    continue
                if parent_sid in pending:
                    continue  # its parent is added first
                report.detached.append(sid)
                parent = None
            if sid in rows:  # most agents: _add_quiet, inline
                get = created.get
                agent_id = str(get("agent_id"))
                try:  # the name is free (nearly always): a taken one is renamed by _add_node
                    add_unbuilt(
                        agent_id,
                        sid,
                        str(get("name")),
                        parent,
                        str(get("instructions", "")),
                        quiet.fields[sid],
                    )
                    unbuilt[agent_id] = rows[sid]
                    placed[sid] = agent_id
                except NameCollisionError:
                    session = quiet.session(sid)
                    placed[sid] = _add_node(tree, sid, created, session, parent, report)
            else:
                placed[sid] = _add_node(tree, sid, created, records[sid], parent, report)
            del pending[sid]
            progressed = True
        if not progressed:  # a parent cycle can only come from damage: detach one
            sid = sorted(pending)[0]
            report.detached.append(sid)
            session = quiet.session(sid) if sid in rows else records[sid]
            placed[sid] = _add_node(tree, sid, pending.pop(sid), session, None, report)


def _cascade_terminate(
    root: RootStores, sid: str, f: AgentFacts, session: Session, report: RecoveryReport
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
    created: dict[str, Any],
    session: Session,
    parent_id: str | None,
    report: RecoveryReport,
) -> str:
    get = created.get
    name = str(get("name"))
    # positional: built for every agent at a start (AgentNode's fields, in order)
    node = AgentNode(
        str(get("agent_id")),
        sid,
        name,
        parent_id,
        str(get("instructions", "")),
        session.provider,
        session.model,
    )
    try:  # the name is free (nearly always): the tree looks its siblings up once
        tree.add(node)
    except NameCollisionError:
        suffix = 1
        while tree.name_taken(parent_id, f"{name}-{suffix}"):
            suffix += 1
        node.name = f"{name}-{suffix}"
        report.detached.append(sid)
        tree.add(node)
    return node.agent_id


def analyze(root: str | os.PathLike[str]) -> RecoveryPlan:
    """What recovery would do, per agent, without writing anything (see recovery_plan)."""
    from substrat.recovery_plan import analyze as plan

    return plan(root)
