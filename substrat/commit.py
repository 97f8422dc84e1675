"""Committing a turn and applying what it did.

A turn's tool calls only stage effects (:class:`~substrat.tools.TurnEffects`).
:meth:`CommitMixin._stage_commit` adds the replies to requests the turn
consumed and returns the effects for the ``turn.complete`` entry, the commit
point; :meth:`CommitMixin.apply_effects` then creates the children, enqueues
the messages (``message.enqueued`` in each recipient's log before the inbox
sees it), logs the consumed messages as delivered and terminates what the
turn asked to. Every step checks before it writes, so recovery rolls a cut
commit forward with the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from substrat import events
from substrat.agents import (
    USER,
    AgentNode,
    AgentState,
    AgentTree,
    InboxRegistry,
    MessageEnvelope,
)
from substrat.errors import AgentError, DurabilityError, OutcomeUnknownError
from substrat.eventlog import Clock
from substrat.logs import LogPool
from substrat.session import Session, SessionStore
from substrat.tools import TurnEffects

if TYPE_CHECKING:
    from substrat.queries import AgentInfo


@dataclass
class TurnResult:
    agent_id: str
    turn_id: str
    response: str
    spawned: list[str] = field(default_factory=list)
    messages_sent: list[str] = field(default_factory=list)
    prompt: str = ""
    """The prompt as logged (a lost-turn notice may precede the caller's text)."""
    effects: dict[str, Any] = field(default_factory=dict)
    """What the turn committed: spawns, messages, terminations, delivered ids."""
    transcript: list[dict[str, Any]] = field(default_factory=list)
    """The provider's record of the turn, as logged in ``turn.complete``."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent_id": self.agent_id,
            "turn_id": self.turn_id,
            "response": self.response,
            "spawned": list(self.spawned),
            "messages_sent": list(self.messages_sent),
            "prompt": self.prompt,
            "effects": self.effects,
            "transcript": self.transcript,
        }


@contextmanager
def after_commit(what: str) -> Iterator[None]:
    """Steps after an operation's commit point: an I/O failure there cannot undo it.

    The operation happened (its commit record is durable), but memory no longer
    matches the disk, so the caller gets :class:`OutcomeUnknownError` (undecided
    until a restart, whose recovery finishes the steps), never a plain failure.
    """
    try:
        yield
    except OutcomeUnknownError:
        raise
    except DurabilityError as exc:
        raise OutcomeUnknownError(
            f"{what}, but a later step failed ({exc}); restart the daemon: recovery "
            "finishes what is missing"
        ) from exc


class CommitMixin:
    """The commit half of :class:`~substrat.orchestrator.Orchestrator`."""

    tree: AgentTree
    inboxes: InboxRegistry
    logs: LogPool
    store: SessionStore
    sessions: dict[str, Session]
    turn_counts: dict[str, int]
    settled_turns: dict[str, int]
    clock: Clock
    new_id: Callable[[], str]

    if TYPE_CHECKING:

        def emit(self, kind: str, payload: dict[str, Any]) -> None: ...

        def _info(self, node: AgentNode) -> AgentInfo: ...

        def terminate_now(self, agent_id: str) -> list[str]: ...

    def _log_creation(self, node: AgentNode, parent_session_id: str | None) -> None:
        log = self.logs.get(node.session_id)
        log.log(
            events.SESSION_CREATED,
            {"provider": node.provider, "model": node.model, "system_prompt": node.instructions},
        )
        log.log(
            events.AGENT_CREATED,
            {
                "agent_id": node.agent_id,
                "name": node.name,
                "parent_session_id": parent_session_id,
                "instructions": node.instructions,
            },
        )

    def materialize_child(self, spawn: dict[str, Any], parent: AgentNode) -> AgentNode | None:
        """Create a child staged by a committed turn; a no-op if it exists already."""
        if spawn["agent_id"] in self.tree:
            return None
        node = AgentNode(
            agent_id=spawn["agent_id"],
            session_id=spawn["session_id"],
            name=spawn["name"],
            parent_id=parent.agent_id,
            instructions=spawn["instructions"],
            provider=spawn["provider"],
            model=spawn["model"],
        )
        session = self.sessions.get(node.session_id)
        if session is None:
            session = Session(node.session_id, node.provider, node.model, agent_id=node.agent_id)
            self.store.save(session)
            self.sessions[node.session_id] = session
        self._log_creation(node, parent_session_id=parent.session_id)
        self.tree.add(node)
        self.turn_counts[node.agent_id] = 0
        self.settled_turns[node.agent_id] = 0
        self.emit("agent.created", self._info(node).to_dict())
        return node

    def _stage_commit(self, node: AgentNode, effects: TurnEffects, response: str) -> dict[str, Any]:
        """Add replies to consumed requests; returns the effects for ``turn.complete``."""
        if node.state is AgentState.TERMINATED:
            raise AgentError(f"agent {node.name} was terminated during its turn")
        for message in effects.consumed:
            if message.kind == "request" and (
                message.sender == USER or message.sender in self.tree
            ):
                effects.messages.append(
                    MessageEnvelope(
                        message_id=self.new_id(),
                        sender=node.agent_id,
                        recipient=message.sender,
                        kind="reply",
                        payload=response,
                        timestamp=self.clock(),
                        reply_to=message.message_id,
                        metadata={"turn_id": effects.turn_id},
                    ).to_dict()
                )
        return {"effects": effects.to_dict()}

    def apply_effects(self, node: AgentNode, effects: dict[str, Any]) -> None:
        """Apply a committed turn's effects; each step is a no-op if already done."""
        for spawn in effects.get("spawns", []):
            self.materialize_child(spawn, node)
        for data in effects.get("messages", []):
            if MessageEnvelope.is_valid(data):
                self.enqueue(MessageEnvelope.from_dict(data))
        delivered = list(effects.get("delivered", []))
        if delivered:
            inbox = self.inboxes.inbox(node.agent_id)
            still_here = [m for m in delivered if m in inbox]
            if still_here:
                self.logs.get(node.session_id).log(
                    events.MESSAGE_DELIVERED, {"message_ids": still_here}
                )
                inbox.remove(still_here)
                self.emit(
                    "message.delivered", {"recipient": node.agent_id, "message_ids": still_here}
                )
        if node.agent_id in self.tree:
            for data in effects.get("messages", []):
                if (
                    data["kind"] == "request"
                    and data["recipient"] in self.tree
                    and not self._reply_arrived(node, data["message_id"])
                ):
                    node.waiting_on[data["message_id"]] = data["recipient"]
        for agent_id in effects.get("terminations", []):
            if agent_id in self.tree:
                self.terminate_now(agent_id)
        if node.state is not AgentState.TERMINATED and node.agent_id in self.tree:
            node.state = AgentState.WAITING if node.waiting_on else AgentState.IDLE

    def _reply_arrived(self, node: AgentNode, request_id: str) -> bool:
        return any(m.reply_to == request_id for m in self.inboxes.inbox(node.agent_id).all())

    def enqueue(self, message: MessageEnvelope) -> bool:
        """Log a message to its recipient's log, then deliver it; False if dropped."""
        recipient = message.recipient
        if recipient != USER and recipient not in self.tree:
            return False  # the recipient was terminated: nobody left to read it
        inbox = self.inboxes.inbox(recipient)
        if message.message_id in inbox:
            return True
        session_id = USER if recipient == USER else self.tree.get(recipient).session_id
        self.logs.get(session_id).log(events.MESSAGE_ENQUEUED, message.to_dict())
        self.inboxes.deliver(message)
        if message.kind == "reply" and recipient != USER and message.reply_to:
            waiter = self.tree.get(recipient)
            waiter.waiting_on.pop(message.reply_to, None)
            if not waiter.waiting_on and waiter.state is AgentState.WAITING:
                waiter.state = AgentState.IDLE
        self.emit("message.enqueued", message.to_dict())
        return True
