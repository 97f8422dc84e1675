"""Applying a recovered state to a running orchestrator.

:func:`substrat.recovery.recover` turns the disk into a
:class:`~substrat.recovery.Recovered` value and writes only what needs no
orchestrator (records, repairs, cascades, registrations). :func:`apply` hands
that value to the orchestrator (anything shaped like :class:`Host`) and
finishes the roll-forward with the orchestrator's own commit code, so a commit
cut short by a crash is completed exactly as a live turn would have completed
it: children created, messages logged into their recipients' logs, ordered
terminations carried out; then turns lost in flight are closed in the log,
inboxes filled and waits restored.
"""

from __future__ import annotations

from typing import Any, Protocol

from substrat import events, recovery_user
from substrat.agents import USER, AgentNode, AgentState, AgentTree, InboxRegistry
from substrat.lazy import LazyDict
from substrat.logs import LogPool
from substrat.recovery import Recovered, RecoveryReport
from substrat.session import Session

LOST_IN_FLIGHT = "lost in flight: the daemon stopped mid-turn"
OUTCOME_UNKNOWN = (
    "outcome unknown: a damaged log line follows its start (its turn.complete may be that "
    "line, so it may have completed and its tool calls taken effect)"
)


class Host(Protocol):
    """What :func:`apply` needs of the orchestrator."""

    tree: AgentTree
    inboxes: InboxRegistry
    logs: LogPool
    sessions: dict[str, Session]
    turn_counts: dict[str, int]
    settled_turns: dict[str, int]
    last_complete_seq: dict[str, int]

    def materialize_child(self, spawn: dict[str, Any], parent: AgentNode) -> AgentNode | None: ...

    def terminate_now(self, agent_id: str) -> list[str]: ...


def apply(host: Host, recovered: Recovered) -> RecoveryReport:
    """Serve ``recovered`` from ``host`` and finish its roll-forward; returns the report."""
    report, plan = recovered.report, recovered.plan
    host.tree = tree = recovered.tree
    sessions = recovered.sessions  # a quiet agent's record built when first asked for
    sessions.update(host.sessions)
    host.sessions = sessions
    _count(host, recovered)
    for spawn in plan.spawns:
        if host.materialize_child(spawn.spawn, host.tree.get(spawn.parent_id)) is not None:
            child = spawn.spawn["agent_id"]
            report.reconciled.append(f"spawn:{child}")
            # a child whose agent.created was damaged may have turns already
            host.turn_counts[child] = spawn.facts.turn_counter
            host.last_complete_seq[child] = spawn.facts.last_complete_seq
    for endpoint, data in plan.messages:
        host.logs.get(endpoint).log(events.MESSAGE_ENQUEUED, data)
        report.reconciled.append(f"message:{data['message_id']}")
    for agent_id in plan.terminations:
        if agent_id in host.tree:
            host.terminate_now(agent_id)
            report.reconciled.append(f"terminate:{agent_id}")
    inboxes, redelivered = host.inboxes, report.redelivered
    delivered: list[dict[str, Any]] = []
    for data in plan.pending:  # each a valid envelope's (see rollforward.plan)
        recipient = data["recipient"]
        if recipient == USER or recipient in tree:
            # built when the inbox is first read: most of a restart's are the user's,
            # thousands unread (the start without checkpoints pays the same)
            inboxes.deliver_data(data)
            delivered.append(data)
    deferred = recovered.deferred_user
    if deferred is None:
        redelivered.extend(data["message_id"] for data in delivered)
    else:  # decoded when first read, listed now: see substrat.recovery_user
        inboxes.defer(USER, deferred.pending, deferred.delivered)
        redelivered.extend(recovery_user.redelivered(deferred, delivered))
    # Every agent is IDLE, waiting on nothing and told nothing until here (recovery built
    # it so, materialize_child too): only the agents the plan names change.
    for agent_id, waits in plan.waiting.items():
        if agent_id not in host.tree:
            continue
        node = host.tree.get(agent_id)
        for message_id, recipient in waits.items():
            if recipient in host.tree:
                node.waiting_on[message_id] = recipient
        node.state = AgentState.WAITING if node.waiting_on else AgentState.IDLE
    if plan.lost or plan.notices:
        for node in host.tree.walk():  # in the tree's order: the log writes and the report
            lost = plan.lost.get(node.session_id)
            if lost is not None:
                # Closed durably, so the next start does not report it again; the
                # agent is still told at its next turn (node.lost_turn).
                host.logs.get(node.session_id).log(
                    events.TURN_FAILED,
                    {
                        **lost,
                        "error": OUTCOME_UNKNOWN if lost.get("record_damaged") else LOST_IN_FLIGHT,
                        "lost": True,
                    },
                )
                report.lost_turns.append({"agent_id": node.agent_id, **lost})
            node.lost_turn = lost or plan.notices.get(node.session_id)
    # every committed turn is applied now (or its agent is gone)
    turn_counts = host.turn_counts
    settled = host.settled_turns
    assert isinstance(turn_counts, LazyDict)
    built = {a: v for a, v in settled.items() if not turn_counts.is_source(a)}
    for agent_id in turn_counts.built_keys():
        built[agent_id] = turn_counts[agent_id]
    host.settled_turns = LazyDict(built, turn_counts.sources_copy(), _turns)
    report.agents = len(host.tree)
    report.roots = len(host.tree.roots())
    host.tree.check()
    return report


def _turns(agent_id: str, row: list[Any]) -> int:
    # as AgentFacts.turn_counter has it: highest_turn + damaged_after (see start_summary)
    turns: int = row[1] + row[2]
    return turns


def _last_complete_seq(agent_id: str, row: list[Any]) -> int:
    seq: int = row[4]
    return seq


def _count(host: Host, recovered: Recovered) -> None:
    """Every agent's turn counter and last completed seq: an agent whose node is not
    built (see :meth:`AgentTree.add_unbuilt`) has them from its summary row when first
    asked for, as its facts have them (a quiet agent's are built of that row)."""
    counters = recovered.facts.counters
    tree = host.tree
    rows = recovered.unbuilt
    turn_counts: LazyDict[str, int] = LazyDict(host.turn_counts, dict(rows), _turns)
    seqs: LazyDict[str, int] = LazyDict(host.last_complete_seq, dict(rows), _last_complete_seq)
    for agent_id in tree.built_ids():
        if agent_id not in rows:
            turn_counts[agent_id], seqs[agent_id] = counters(tree.session_of(agent_id))
    host.turn_counts, host.last_complete_seq = turn_counts, seqs
