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

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

from substrat import events
from substrat.agents import (
    USER,
    AgentNode,
    AgentState,
    AgentTree,
    InboxRegistry,
    MessageEnvelope,
)
from substrat.errors import (
    AgentError,
    AgentTerminatedError,
    DurabilityError,
    OutcomeUnknownError,
)
from substrat.eventlog import LOG_NAME, PENDING_NAME, Clock
from substrat.logs import LogPool
from substrat.multiplexer import Multiplexer, stop_later
from substrat.oserrors import with_advice
from substrat.providers.base import ProviderSession
from substrat.registry import RootRegistry, root_entry
from substrat.session import Session, SessionState, SessionStore
from substrat.tools import TurnEffects

if TYPE_CHECKING:
    from substrat.queries import AgentInfo

log = logging.getLogger(__name__)


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
def after_commit(
    what: str, remedy: str = "restart the daemon: recovery finishes what is missing"
) -> Iterator[None]:
    """Steps after an operation's commit point: no failure there can undo it.

    The operation happened (its commit record is durable), but memory no longer
    matches the disk, so the caller gets :class:`OutcomeUnknownError` (undecided
    until the steps are finished; ``details["committed"]`` says it happened),
    never a plain failure. Any exception counts, not only a failed fsync: a
    directory a read-only mount refuses, a log no descriptor is left to open.
    """
    try:
        yield
    except OutcomeUnknownError as exc:
        exc.with_details(committed=True)
        raise
    except Exception as exc:  # the error's answer adds what fixes it (oserrors.advice)
        raise OutcomeUnknownError(
            f"{what}, but a later step failed ({exc}); {remedy}"
        ).with_details(committed=True) from exc


@dataclass
class Unapplied:
    """A committed turn whose effects could not all be applied in this daemon yet."""

    node: AgentNode
    number: int
    turn_id: str
    effects: dict[str, Any]
    error: str
    done: set[str] = field(default_factory=set)
    """The steps already applied (``spawn:<agent id>``, ``message:<message id>``):
    between two tries a child may be terminated or a message read, and applying
    those steps again would bring the child back or deliver the message twice."""

    def to_dict(self, path: str) -> dict[str, Any]:
        return {"agent": path, "turn_id": self.turn_id, "error": self.error}


Step = tuple[str, Callable[[], object]]
"""A step after a commit point: its key in ``done``, and what it does."""

RETRIED = (
    "the daemon finishes it before that agent is next used and lists it in "
    "`substrat daemon status` until then (a restart's recovery finishes it too)"
)


@dataclass
class Unfinished:
    """A committed creation or termination whose later steps failed in this daemon.

    The steps left are tried again, in order, before any of ``agents`` is next used
    and by the wake loop (as a turn's effects are: :class:`Unapplied`); those in
    ``done`` are not: a session record written, a log's record appended, once."""

    what: str
    agents: list[str]
    terminating: bool
    """A termination: its agents are refused as terminated, not only their turns."""
    steps: list[Step]
    error: str = ""
    done: set[str] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "error": self.error}

    def finish(self) -> Exception | None:
        """Run the steps not done yet, in order; the first failure (kept in ``error``)."""
        for key, step in self.steps:
            if key in self.done:
                continue
            try:
                step()
            except Exception as exc:
                self.error = with_advice(str(exc), exc)
                return exc
            self.done.add(key)
        return None


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
    unapplied: dict[str, Unapplied]
    """Agent id -> its committed turn whose effects failed to apply (see
    :meth:`apply_committed`); retried by :meth:`roll_forward`."""
    on_unapplied: Callable[[], None] | None
    """Called when a turn's effects or an operation's later steps failed (the daemon
    wakes its retry loop)."""
    unfinished: list[Unfinished]
    """Creations and terminations whose steps after the commit point failed, oldest
    first; finished by :meth:`roll_forward`."""
    roots: RootRegistry
    mux: Multiplexer

    if TYPE_CHECKING:

        def _settle(self, node: AgentNode, number: int) -> None: ...

        def emit(self, kind: str, payload: dict[str, Any]) -> None: ...

        def _info(self, node: AgentNode) -> AgentInfo: ...

        def forget(self, node: AgentNode) -> None: ...

    def _log_creation(
        self, node: AgentNode, parent_session_id: str | None, *, fresh: bool = False
    ) -> None:
        # fresh: the session's directory was created just now and holds its record alone
        log = self.logs.get(node.session_id, fresh=fresh)
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

    def _take_back_creation(self, session_id: str, exc: OSError) -> NoReturn:
        """Remove what a root creation refused before its commit point (a host limit:
        no descriptor, a full disk) made, then raise: ``exc`` itself, or, if some of it
        stays, a DurabilityError saying so, caused by ``exc``."""
        self.sessions.pop(session_id, None)
        self.logs.close(session_id)
        stayed = self.store.take_back_new(session_id, (LOG_NAME, PENDING_NAME))
        if stayed is None:
            # exc as it is: `raise exc from exc` made exc its own cause, and the code that
            # adds the host's remedy (a full disk: free space) then no longer saw the OSError
            raise exc
        raise DurabilityError(
            f"{exc}; nothing of it was done, but its session directory could not be "
            f"removed ({stayed}): the next start's recovery terminates it"
        ) from exc

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
        fresh = False
        if session is None:
            session = Session(node.session_id, node.provider, node.model, agent_id=node.agent_id)
            fresh = self.store.save(session)
            self.sessions[node.session_id] = session
        self._log_creation(node, parent_session_id=parent.session_id, fresh=fresh)
        self.tree.add(node)
        self.turn_counts[node.agent_id] = 0
        self.settled_turns[node.agent_id] = 0
        self.emit("agent.created", self._info(node).to_dict())
        return node

    def committed_then(self, item: Unfinished) -> None:
        """Run the steps after an operation's commit point; if one fails, the rest are
        kept for :meth:`roll_forward` and the caller gets OutcomeUnknownError with
        ``committed`` (it happened: not to be sent again)."""
        failed = item.finish()
        if failed is None:
            return
        self.unfinished.append(item)
        if self.on_unapplied is not None:
            self.on_unapplied()
        raise OutcomeUnknownError(
            f"{item.what}, but a later step failed ({failed}); {RETRIED}"
        ).with_details(committed=True) from failed

    async def finish_creation(
        self, node: AgentNode, session: Session, live: ProviderSession
    ) -> None:
        """A root's steps after its commit point (``agent.created`` in its log): its
        registration (a registered root is one whose creation is durable), its session
        ACTIVE, then a slot for its live session. ACTIVE in memory only: the record
        stays the CREATED one written before the commit point, as a crash right after
        the registration always left it (``SessionStore.activate``)."""

        def activate() -> None:  # not if terminated before a retry got to it
            if session.state is SessionState.CREATED:
                self.store.activate(session)

        steps: list[Step] = [
            ("register", lambda: self.roots.register(root_entry(node))),
            ("active", activate),
        ]
        what = f"agent {node.name} was created"
        try:
            self.committed_then(Unfinished(what, [node.agent_id], False, steps))
        except OutcomeUnknownError:
            stop_later(live)  # loaded at its first turn, as an evicted agent is
            raise
        try:
            await self.mux.admit(node, live)
        except Exception as exc:  # no room now (another's suspend failed): as above
            self.mux.discard(node)
            stop_later(live)
            log.warning("agent %s is created, not live yet: %s", node.name, exc)

    def terminate_now(self, agent_id: str) -> list[str]:
        """Terminate ``agent_id`` and its subtree (leaves first); the ids terminated."""
        order = self.tree.subtree_leaves_first(agent_id)
        top = order[-1]
        descendants = [n.agent_id for n in order[:-1]]
        self.logs.get(top.session_id).log(
            events.AGENT_TERMINATED, {"agent_id": top.agent_id, "cascade": descendants}
        )
        steps: list[Step] = []
        for node in order:
            if node is not top:
                steps.append((f"log:{node.agent_id}", self._terminated_by(node, top)))
            steps.append((f"forget:{node.agent_id}", partial(self.forget, node)))
        what = f"agent {top.name} was terminated"
        self.committed_then(Unfinished(what, [n.agent_id for n in order], True, steps))
        return [n.agent_id for n in order]

    def _terminated_by(self, node: AgentNode, top: AgentNode) -> Callable[[], object]:
        data = {"agent_id": node.agent_id, "by": top.agent_id}
        return lambda: self.logs.get(node.session_id).log(events.AGENT_TERMINATED, data)

    def check_finished(self, node: AgentNode | None, *, turn: bool) -> None:
        """Finish what is unfinished first; then refuse ``node`` if its termination is
        still unfinished (and, for a ``turn``, if its creation is)."""
        if not self.unfinished:
            return
        self.roll_forward()
        if node is None:
            return
        for item in self.unfinished:
            if node.agent_id in item.agents and (turn or item.terminating):
                path = self.tree.path(node.agent_id) if node.agent_id in self.tree else node.name
                if item.terminating:
                    raise AgentTerminatedError(
                        f"{item.what}, but a later step failed: {item.error}; it takes no "
                        "more requests (the daemon finishes the termination, a restart too)"
                    ).with_details(agent=path)
                raise DurabilityError(
                    f"{item.what}, but a later step failed: {item.error}; nothing of this turn "
                    "was run, retry once that is fixed (the daemon finishes the creation, a "
                    "restart too)"
                ).with_details(agent=path)

    def apply_committed(
        self, node: AgentNode, number: int, turn_id: str, effects: dict[str, Any]
    ) -> None:
        """Apply a committed turn's effects; a failure leaves them to :meth:`roll_forward`.

        The turn happened, so the caller gets :class:`OutcomeUnknownError` with
        ``committed``; until the effects are applied the agent takes no turn (its
        log says more happened than memory shows) and ``daemon status`` lists it.
        """
        path = self.tree.path(node.agent_id)
        done: set[str] = set()
        try:
            with after_commit(
                f"turn {turn_id} of {path} committed",
                "the daemon applies it again before the agent's next turn and lists it in "
                "`substrat daemon status` until then (a restart's recovery applies it too)",
            ):
                self.apply_effects(node, effects, done)
        except OutcomeUnknownError as exc:
            cause = exc.__cause__ or exc
            error = with_advice(f"applying its effects failed ({cause})", cause)
            self.unapplied[node.agent_id] = Unapplied(node, number, turn_id, effects, error, done)
            if self.on_unapplied is not None:
                self.on_unapplied()
            if node.state is AgentState.BUSY:  # the turn is over, its effects are not
                node.state = AgentState.WAITING if node.waiting_on else AgentState.IDLE
            exc.with_details(agent=path, turn_id=turn_id)
            raise

    def roll_forward(self) -> list[str]:
        """Finish the unfinished creations and terminations, then apply again each
        committed turn's effects that failed to apply, as recovery would (every step
        checks before it writes); returns the agent ids whose turn is still left."""
        self.unfinished[:] = [item for item in self.unfinished if item.finish() is not None]
        for agent_id, item in list(self.unapplied.items()):
            if agent_id not in self.tree:  # terminated since: recovery skips it too
                del self.unapplied[agent_id]
                continue
            try:
                self.apply_effects(item.node, item.effects, item.done)
            except Exception as exc:
                item.error = with_advice(f"applying its effects failed ({exc})", exc)
                continue
            del self.unapplied[agent_id]
            self._settle(item.node, item.number)
        return list(self.unapplied)

    def check_applied(self, node: AgentNode) -> None:
        """Refuse a turn of an agent whose last committed turn is not applied yet, or
        whose creation or termination is not finished."""
        self.check_finished(node, turn=True)
        if node.state is AgentState.TERMINATED:  # the termination just finished
            path = self.tree.path(node.agent_id) if node.agent_id in self.tree else node.name
            raise AgentTerminatedError(f"agent {path} is terminated")
        if node.agent_id in self.unapplied and node.agent_id in self.roll_forward():
            item = self.unapplied[node.agent_id]
            raise DurabilityError(
                f"agent {self.tree.path(node.agent_id)}'s turn {item.turn_id} committed but "
                f"is not applied yet: {item.error}; nothing of this turn was run, retry once "
                "that is fixed (or restart the daemon: recovery applies it)"
            ).with_details(agent=self.tree.path(node.agent_id), turn_id=item.turn_id)

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

    def apply_effects(
        self, node: AgentNode, effects: dict[str, Any], done: set[str] | None = None
    ) -> None:
        """Apply a committed turn's effects; each step is a no-op if already done.

        ``done`` collects the spawns and messages applied, and those in it are
        skipped: a running daemon that tries again later must not bring back a
        child terminated meanwhile nor enqueue again a message already read
        (recovery, which runs before anything else, passes none).
        """
        done = set() if done is None else done
        for spawn in effects.get("spawns", []):
            key = f"spawn:{spawn['agent_id']}"
            if key not in done:
                self.materialize_child(spawn, node)
                done.add(key)
        for data in effects.get("messages", []):
            if MessageEnvelope.is_valid(data):
                key = f"message:{data['message_id']}"
                if key not in done:
                    self.enqueue(MessageEnvelope.from_dict(data))
                    done.add(key)
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
            key = f"terminate:{agent_id}"
            if agent_id in self.tree and key not in done:
                try:
                    self.terminate_now(agent_id)
                except OutcomeUnknownError as exc:
                    if exc.details.get("committed"):
                        done.add(key)  # its own rest is unfinished (roll_forward finishes it)
                    raise
                done.add(key)
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
