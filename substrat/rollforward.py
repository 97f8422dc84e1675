"""What recovery leaves for the orchestrator to finish: the roll-forward plan.

A committed turn (its ``turn.complete`` is durable) happened, whatever a crash
cut short after it. :func:`plan` reads the facts of the live agents and says
what is left to do, without doing it: children spawned that do not exist,
messages sent that their recipient's log never received, terminations ordered
that did not happen, turns lost in flight, and then every inbox (enqueued minus
delivered, the rolled-forward messages included) and every request still
waiting for its reply. The orchestrator applies the plan with the same code a
live turn's commit uses (:mod:`substrat.restore`).

Nothing here touches the disk; the plan is a value, so the dry run and the
tests can look at it.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from substrat.agents import USER, AgentTree, MessageEnvelope
from substrat.facts import AgentFacts
from substrat.session import Session, SessionState


@dataclass
class Spawn:
    """A child a committed turn spawned that does not exist yet."""

    parent_id: str
    spawn: dict[str, Any]
    facts: AgentFacts
    """The child's facts: empty, unless its log exists without a readable ``agent.created``."""


@dataclass
class RollForward:
    spawns: list[Spawn] = field(default_factory=list)
    messages: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """(the recipient's endpoint: a session id or ``"user"``, the envelope), in order."""
    terminations: list[str] = field(default_factory=list)
    """Agent ids a committed turn ordered terminated; each is done if it is still alive."""
    lost: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Session id -> the turn a crash cut off (to close in the log and tell the agent)."""
    notices: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Session id -> a lost turn closed by an earlier recovery, not yet told to the agent."""
    pending: list[dict[str, Any]] = field(default_factory=list)
    """Every inbox's messages (the user's too) once the plan is applied, in arrival order."""
    waiting: dict[str, dict[str, str]] = field(default_factory=dict)
    """Agent id -> the requests it sent and awaits a reply to (message id -> recipient);
    an agent that awaits none may be missing."""


def plan(
    tree: AgentTree,
    live: dict[str, AgentFacts],
    facts: dict[str, AgentFacts],
    records: dict[str, Session],
    user: AgentFacts,
    held: set[str],
) -> RollForward:
    """The roll-forward of the agents in ``tree`` (see the module docstring).

    ``live`` maps the session of every agent in ``tree`` to its facts; the facts
    of message recipients are updated as if the plan had run, so inboxes and
    replies come out right without reading anything again.
    """
    out = RollForward()
    # Only an agent with a committed turn, a message, an open or lost turn or a request
    # has anything to plan: most agents of a checkpointed root have none, so the rest
    # is planned over those alone, in the tree's walk order (the plan's lists follow it)
    busy = {sid for sid, f in live.items() if _busy(f)}
    sources = [(node, live[node.session_id]) for node in tree.in_walk_order(busy)]
    committing = [(node, f) for node, f in sources if f.committed]
    planned: dict[str, AgentFacts] = {}  # agent id of a child to spawn -> its facts
    for node, f in committing:
        for effects in f.committed:
            for spawn in effects.get("spawns", []):
                if spawn["agent_id"] in tree:
                    continue  # alive (a parent's checkpoint keeps its live children's spawns)
                sid = spawn["session_id"]
                child_facts = facts.get(sid)
                record = records.get(sid)
                if (child_facts is not None and child_facts.terminated) or (
                    record is not None and record.state is SessionState.TERMINATED
                ):
                    continue  # spawned, lived and was terminated since
                if sid in held:
                    continue  # its files cannot be read: it comes back when they can
                if spawn["agent_id"] in planned:
                    continue
                child = child_facts or AgentFacts(sid)
                child.created = {"agent_id": spawn["agent_id"], "name": spawn["name"]}
                planned[spawn["agent_id"]] = child
                out.spawns.append(Spawn(node.agent_id, spawn, child))
    children = [(s.spawn["agent_id"], s.facts) for s in out.spawns]
    senders = [(n.agent_id, f) for n, f in committing] + [c for c in children if c[1].committed]
    received: set[str] = set()  # agents of the tree a message was rolled forward to
    for _, f in senders:
        for effects in f.committed:
            for data in effects.get("messages", []):
                if not MessageEnvelope.is_valid(data):
                    continue  # a kind from a newer version: nothing here can deliver it
                recipient = data["recipient"]
                if recipient == USER:
                    target, endpoint = user, USER
                elif recipient in tree:
                    target = live[tree.get(recipient).session_id]
                    endpoint = target.session_id
                    received.add(endpoint)
                elif recipient in planned:
                    target = planned[recipient]
                    endpoint = target.session_id
                else:
                    continue  # the recipient was terminated: the message has no reader
                if not target.received(data):
                    out.messages.append((endpoint, data))
                    target.enqueued[data["message_id"]] = data
    for _, f in senders:
        for effects in f.committed:
            out.terminations.extend(effects.get("terminations", []))
    if received - busy:  # their inboxes are no longer empty
        sources = [(node, live[node.session_id]) for node in tree.in_walk_order(busy | received)]
    everyone = [(n.agent_id, f) for n, f in sources] + children
    for agent_id, f in everyone:
        if not (f.open_turns or f.lost_notice is not None or f.waiting or f.committed):
            continue
        if f.lost_turn is not None:
            out.lost[f.session_id] = f.lost_turn_with_doubt
        elif f.lost_notice is not None:
            out.notices[f.session_id] = f.lost_notice
        if f.waiting or f.committed:
            out.waiting[agent_id] = _waiting(f)
    pending: list[dict[str, Any]] = list(user.pending())
    for _, f in everyone:
        if f.enqueued:  # the plan above may have added to it
            pending.extend(f.pending())
    # every pending message is a valid envelope (AgentFacts keeps no other: see add,
    # from_dict, and the check above), so its timestamp and id are strings: no call per
    # message for the key (the user's thousands of unread messages at a restart)
    pending.sort(key=ARRIVAL)
    out.pending = pending
    return out


ARRIVAL = operator.itemgetter("timestamp", "message_id")
"""A pending message's place among all inboxes' at a restart."""


def _busy(f: AgentFacts) -> bool:
    return bool(f.committed or f.enqueued or f.open_turns or f.waiting) or (
        f.lost_notice is not None
    )


def _waiting(f: AgentFacts) -> dict[str, str]:
    """Requests the agent sent with no reply in its log yet (its recipient may be gone)."""
    replies = {m.get("reply_to") for m in f.enqueued.values() if m.get("kind") == "reply"}
    waiting = {mid: to for mid, to in f.waiting.items() if mid not in replies}
    for data in _messages(f):
        if data.get("kind") == "request" and data.get("message_id") not in replies:
            waiting[data["message_id"]] = data["recipient"]
    return waiting


def _messages(f: AgentFacts) -> Iterator[dict[str, Any]]:
    for effects in f.committed:
        yield from effects.get("messages", [])
