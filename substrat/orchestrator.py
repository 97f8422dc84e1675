"""The orchestrator: trees of agents, their turns and their messages.

Every operation is durable before it is acknowledged:

* ``create_root``: the record is written, then ``session.created`` and
  ``agent.created`` are logged; the latter is the commit point. The root is
  then registered in the root registry (``substrat.registry``) before the
  call returns, so a registered root's directory is known to have existed.
* ``run_turn``: ``turn.start`` is logged before the provider is called;
  ``turn.complete`` carries everything the turn's tool calls staged and is
  the commit point; the effects (children, messages, terminations, consumed
  messages) are applied after it, and recovery rolls them forward if a crash
  cut that short.
* ``terminate``: ``agent.terminated`` on the target (listing its subtree) is
  the commit point; the subtree follows, leaves first.

Recovery (``substrat.recovery``) rebuilds all of this from the logs when the
orchestrator is opened.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from substrat import events, paths, recovery, restore, rootdir
from substrat.agents import (
    USER,
    AgentNode,
    AgentState,
    AgentTree,
    InboxRegistry,
    MessageEnvelope,
    validate_name,
)
from substrat.checkpointer import DEFAULT_POLICY, Checkpointer, CheckpointPolicy
from substrat.checkpoints import Settled
from substrat.commit import CommitMixin, TurnResult, Unapplied, Unfinished
from substrat.errors import (
    AgentBusyError,
    AgentError,
    AgentTerminatedError,
    HasChildrenError,
    NameCollisionError,
    OutcomeUnknownError,
)
from substrat.eventlog import Clock, utc_now_iso
from substrat.live_sessions import LiveSessionsMixin
from substrat.logs import AgentLog, LogPool
from substrat.multiplexer import Multiplexer, stop_later
from substrat.opening import Opening, release_when_dropped, take_hold
from substrat.owner import API, Owner, guard
from substrat.prompts import check_instructions, check_message_ids, check_prompt
from substrat.providers.base import new_agent_model
from substrat.providers.registry import ProviderRegistry, default_registry
from substrat.queries import AgentInfo, QueryMixin
from substrat.registry import RootRegistry
from substrat.root_hold import RootHold
from substrat.scheduler import ChunkSink, TurnScheduler, failure_reason
from substrat.session import Session, SessionState, SessionStore
from substrat.terminated import Graveyard, TerminatedAgent
from substrat.tools import AgentToolContext, StatusSink, TurnEffects
from substrat.wake import WakeMixin
from substrat.words import plural

DEFAULT_SLOTS = 8

Listener = Callable[[str, dict[str, Any]], None]


def uuid_hex() -> str:
    return uuid.uuid4().hex


class Orchestrator(QueryMixin, CommitMixin, WakeMixin, LiveSessionsMixin):
    """Runs a root of agents. Create it with :meth:`open`, which recovers first."""

    def __init__(
        self,
        root: str | Path,
        *,
        registry: ProviderRegistry | None = None,
        slots: int = DEFAULT_SLOTS,
        clock: Clock | None = None,
        new_id: Callable[[], str] | None = None,
        checkpoints: CheckpointPolicy | None = None,
    ) -> None:
        self.owner = Owner()  # the caller's thread and process; see substrat.owner
        self.root = paths.under(root)
        self.registry = registry if registry is not None else default_registry()
        self.clock: Clock = clock or utc_now_iso
        self.new_id: Callable[[], str] = new_id or uuid_hex
        self.store = SessionStore(self.root)
        self.logs = LogPool(self.store, clock=self.clock)
        self.graveyard = Graveyard(self.store)
        # roots/ and checkpoints/ made durable by the store, which knows the root is
        # (open made it and every level above it durable): one fsync, not a walk up.
        self.roots = RootRegistry(self.root, clock=self.clock, make_dir=self.store.make_dir)
        self.tree = AgentTree()
        self.inboxes = InboxRegistry()
        self.scheduler = TurnScheduler()
        self.mux = Multiplexer(slots, self._load_session, self._save_session)
        self.owner.loop_check = self.mux.check_loop  # see Multiplexer.check_loop
        self.sessions: dict[str, Session] = {}
        self.turn_counts: dict[str, int] = {}
        self.failing_wakes: set[str] = set()
        self.settled_turns: dict[str, int] = {}
        """Agent id -> the turn up to which all its turns' effects are applied (a turn
        whose effects failed to apply holds it back until a restart rolls them forward)."""
        self.last_complete_seq: dict[str, int] = {}
        self.unapplied: dict[str, Unapplied] = {}
        self.on_unapplied: Callable[[], None] | None = None
        self.unfinished: list[Unfinished] = []
        self.hold: RootHold | None = None
        """The hold this orchestrator took on its root (None: its opener holds it)."""
        self.checkpointer = Checkpointer(
            self.root, self.logs, checkpoints or DEFAULT_POLICY, self, clock=self.clock
        )
        self.checkpointer.store.make_dir = self.store.make_dir
        if self.checkpointer.policy.enabled:
            self.logs.on_append = self.checkpointer.appended
        self._contexts: dict[str, AgentToolContext] = {}
        self._listeners: list[Listener] = []
        self.recovery_report: recovery.RecoveryReport | None = None
        self.closed = False

    @classmethod
    def open(
        cls, root: str | Path, *, hold: RootHold | None = None, **kwargs: Any
    ) -> Opening[Self]:
        """Open a root: recover everything the logs hold, then serve.

        ``await Orchestrator.open(root)``, or ``async with Orchestrator.open(root)
        as orch:``, which closes it when the block ends (substrat.opening; so does
        ``async with orch:``). ``root`` is created when missing. A directory that
        holds anything substrat does not put in a root (a mistyped path to a
        project, a home directory) is refused with
        :class:`~substrat.errors.NotARootError` before anything is written; a root
        of a newer format with :class:`~substrat.errors.RootUnusableError`. A root
        already open in another orchestrator (a daemon, another process, this
        one) is refused with :class:`~substrat.errors.RootLockedError` before
        anything is read: :meth:`close` lets the next one open it, and so does
        dropping it (the collector lets go, as after a crash). ``hold`` is a hold
        the caller already has on the root (the daemon's, fsck's; they keep and
        release it); without one, open takes its own, and :meth:`close` gives it
        back.
        """
        return Opening(cls._open(root, hold, kwargs))

    @classmethod
    async def _open(cls, root: str | Path, hold: RootHold | None, kwargs: Any) -> Self:
        rootdir.refuse_strangers(root)
        orch = cls(root, **kwargs)
        orch.store.make_root_durable()  # here, not in the first request's latency
        if hold is None:
            orch.hold = hold = take_hold(orch.root)  # see substrat.root_hold
            release_when_dropped(orch, hold)
        try:
            orch.recover()
        except BaseException:
            if orch.hold is not None:
                orch.hold.release()
            raise
        return orch

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def recover(self) -> recovery.RecoveryReport:
        """Rebuild everything from the root's logs (what :meth:`open` does first).

        :func:`substrat.recovery.recover` reads and repairs the disk into a
        value; :func:`substrat.restore.apply` serves it and finishes what
        committed turns left undone, with this orchestrator's commit code.
        """
        with recovery.gc_paused():  # applying it builds as many objects per agent
            recovered = recovery.recover(self.store, self.logs, self.roots)
            self.recovery_report = restore.apply(self, recovered)
            self.checkpointer.adopt(recovered)
            if recovered.deferred_user is not None:  # see substrat.recovery_user
                recovered.deferred_user.readopt = self.checkpointer.readopt
            del recovered  # the facts of every agent go here, not in a collection
        return self.recovery_report

    # -- checkpoints (see substrat.checkpointer) ---------------------------------

    async def checkpoint(self, agent: str | None = None) -> int:
        """Checkpoint ``agent``'s log (every log if None) now, sealing and compacting as
        the policy says; returns how many checkpoints were written."""
        before = self.checkpointer.stats.written
        endpoints = self.logs.known() if agent is None else [self.resolve_live(agent).session_id]
        for endpoint in endpoints:
            self.checkpointer.due(endpoint)
        self.checkpointer.poke()
        await self.checkpointer.drain()
        self.checkpointer.compact(endpoints)
        # no start summary here: only a clean stop writes one, after its last write
        # (see substrat.start_summary)
        return self.checkpointer.stats.written - before

    def settled(self) -> Settled:
        held = self.recovery_report is not None and bool(self.recovery_report.unreadable)
        return Settled(dict(self.settled_turns), strict=held)

    def quiet(self, endpoint: str) -> bool:
        if endpoint == USER:
            return True
        node = self.tree.by_session(endpoint)
        return (
            node is not None
            and node.state is not AgentState.BUSY
            and self.settled_turns.get(node.agent_id) == self.turn_counts.get(node.agent_id, 0)
        )

    def _settle(self, node: AgentNode, number: int) -> None:
        """Turn ``number`` is over, its effects (if any) applied."""
        if self.settled_turns.get(node.agent_id, 0) == number - 1:
            self.settled_turns[node.agent_id] = number

    async def close(self) -> None:
        """Clean shutdown: suspend live sessions (blobs saved) and close the logs."""
        if self.closed:
            return
        await self.mux.suspend_all()
        await self.checkpointer.close()
        self.logs.close_all()
        self.roots.close()
        # the last write of this process (see substrat.start_summary): the next to
        # write to the root retires it first
        self.checkpointer.summarize()
        self.closed = True
        if self.hold is not None:
            self.hold.release()

    # -- notifications -----------------------------------------------------

    def subscribe(self, callback: Listener) -> Callable[[], None]:
        """Call ``callback(kind, payload)`` on every event; returns the unsubscriber."""
        self._listeners.append(callback)

        def unsubscribe() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return unsubscribe

    def emit(self, kind: str, payload: dict[str, Any]) -> None:
        """Tell subscribers ``kind`` happened; ``time`` (ISO 8601 UTC) is added."""
        if not self._listeners:
            return  # nobody to tell: no clock read, no copy (every step of an in-process run)
        payload = {**payload, "time": utc_now_iso()}
        for listener in list(self._listeners):
            try:
                listener(kind, payload)
            except Exception:  # a broken subscriber must not break a turn
                pass

    # -- queries (the rest are in QueryMixin) ----------------------------------

    @property
    def busy_turns(self) -> int:
        return self.scheduler.busy_count

    # -- the user's inbox -----------------------------------------------------

    def user_inbox(self) -> list[MessageEnvelope]:
        """Messages for the user, oldest first (not removed: see :meth:`ack_user_messages`)."""
        return self.inboxes.inbox(USER).all()

    def ack_user_messages(self, message_ids: list[str]) -> list[str]:
        """Mark messages the user has received as delivered (one durable entry)."""
        check_message_ids(message_ids)
        inbox = self.inboxes.inbox(USER)
        present = [m for m in message_ids if m in inbox]
        if present:
            self.logs.get(USER).log(events.MESSAGE_DELIVERED, {"message_ids": present})
            inbox.remove(present)
            self.emit("message.delivered", {"recipient": USER, "message_ids": present})
            self.checkpointer.poke()
        return present

    async def collect_user_inbox(self) -> list[MessageEnvelope]:
        """Read and acknowledge the user's messages in one go (in-process callers)."""
        messages = self.user_inbox()
        self.ack_user_messages([m.message_id for m in messages])
        return messages

    # -- creating agents --------------------------------------------------------

    async def create_root(
        self,
        name: str,
        instructions: str = "",
        *,
        provider: str = "scripted",
        model: str | None = None,
    ) -> AgentInfo:
        """Create a root agent; returns once its ``agent.created`` is durable (registered)."""
        self.logs.check_open()  # nothing of a closed orchestrator's may reach the disk
        validate_name(name)
        check_instructions(instructions)
        if self.tree.name_taken(None, name):
            raise NameCollisionError(f"a root agent named {name!r} exists; pick another name")
        self.roots.check_usable()
        backend = self.registry.get(provider)
        model = new_agent_model(backend, model)
        node = AgentNode(
            agent_id=self.new_id(),
            session_id=self.new_id(),
            name=name,
            parent_id=None,
            instructions=instructions,
            provider=provider,
            model=model,
        )
        context = self._context(node)
        live = await backend.create(model, instructions, context)
        if self.tree.name_taken(None, name):
            # a concurrent create took the name while the provider was busy; refuse now,
            # before anything is logged (a logged agent.created would be committed)
            self._contexts.pop(node.agent_id, None)
            stop_later(live)
            raise NameCollisionError(f"a root agent named {name!r} exists; pick another name")
        session = Session(node.session_id, provider, model, agent_id=node.agent_id)
        try:
            fresh = self.store.save_new(session)
            self.sessions[node.session_id] = session
            self._log_creation(node, parent_session_id=None, fresh=fresh)
        except OutcomeUnknownError:
            raise  # its agent.created may stand: recovery decides
        except OSError as exc:  # before the commit point: nothing of it may stay
            self._contexts.pop(node.agent_id, None)
            stop_later(live)
            self._take_back_creation(node.session_id, exc)  # raises
        self.tree.add(node)
        self.turn_counts[node.agent_id] = 0
        self.settled_turns[node.agent_id] = 0
        await self.finish_creation(node, session, live)
        if node.state is AgentState.TERMINATED:
            # terminated while a slot was made for it: a dead agent must not hold a slot
            self.mux.discard(node)
            stop_later(live)
            raise AgentError(f"agent {name} was terminated while it was being created")
        self.emit("agent.created", self._info(node).to_dict())
        self.checkpointer.poke()
        return self._info(node)

    def _context(self, node: AgentNode) -> AgentToolContext:
        context = self._contexts.get(node.agent_id)
        if context is None:
            context = self._contexts[node.agent_id] = AgentToolContext(self, node)
        return context

    def log_provider_note(self, node: AgentNode, event: str, data: dict[str, Any]) -> None:
        self.logs.get(node.session_id).log(event, data)

    async def evict(self, agent: str) -> bool:
        """Suspend the agent's live session now (as an LRU eviction would)."""
        evicted = await self.mux.evict(self.resolve_live(agent))
        self.checkpointer.poke()
        return evicted

    # -- turns ----------------------------------------------------------------

    async def run_turn(
        self,
        agent: str,
        prompt: str,
        *,
        on_chunk: ChunkSink | None = None,
        on_status: StatusSink | None = None,
        wait: bool = False,
    ) -> TurnResult:
        """Run one turn of ``agent`` with ``prompt``; returns once it is committed.

        ``on_status(event, data)`` hears how the turn goes (``turn.waiting``,
        ``turn.started``, ``turn.tool``, ``turn.retrying``). A busy agent raises
        AgentBusyError, or with ``wait`` is waited for.
        """
        check_prompt(prompt)
        node = self.resolve_live(agent)
        if wait and self.scheduler.is_busy(node.session_id):
            if on_status is not None:
                on_status("turn.waiting", {"agent_id": node.agent_id})
            while self.scheduler.is_busy(node.session_id):  # the wake loop may get in first
                await self.scheduler.wait_idle(node.session_id)
        return await self._turn(node, prompt, [], on_chunk, on_status=on_status)

    async def _turn(
        self,
        node: AgentNode,
        prompt: str,
        consumed: list[MessageEnvelope],
        on_chunk: ChunkSink | None,
        *,
        on_status: StatusSink | None = None,
    ) -> TurnResult:
        if node.state is AgentState.TERMINATED:
            raise AgentTerminatedError(f"agent {self.tree.path(node.agent_id)} is terminated")
        if self.scheduler.is_busy(node.session_id):
            path = self.tree.path(node.agent_id)
            raise AgentBusyError(f"agent {path} is running a turn; retry when idle").with_details(
                agent=path
            )
        self.check_applied(node)
        self.scheduler.claim(node.session_id)
        previous_state = node.state
        node.state = AgentState.BUSY
        number = self.turn_counts.get(node.agent_id, 0) + 1
        self.turn_counts[node.agent_id] = number
        effects = TurnEffects(turn_id=f"t{number}")
        effects.consumed.extend(consumed)
        effects.delivered.extend(m.message_id for m in consumed)
        if node.lost_turn is not None:
            prompt = recovery.lost_turn_notice(node.lost_turn) + prompt
        context = self._context(node)
        inbox = self.inboxes.inbox(node.agent_id)
        started = {"agent_id": node.agent_id, "turn_id": effects.turn_id}
        self.emit("turn.started", started)
        if on_status is not None:
            on_status("turn.started", started)
        try:
            live = await self.mux.acquire(node)
        except BaseException:
            self.scheduler.release(node.session_id)
            node.state = previous_state
            inbox.release(effects.turn_id)
            # no turn.start was logged: recovery counts turns from the log, so a number
            # skipped here would be handed out again after a restart
            self.turn_counts[node.agent_id] = number - 1
            raise
        context.effects = effects
        context.on_status = on_status
        try:
            outcome = await self.scheduler.run(
                AgentLog(self.logs, node),
                live,
                effects.turn_id,
                prompt,
                commit=lambda response, _t: self._stage_commit(node, effects, response),
                on_chunk=on_chunk,
            )
        except (Exception, asyncio.CancelledError) as exc:
            # A cancelled turn (a caller's timeout) is a failed turn too: without this
            # the agent stayed BUSY, so the wake loop skipped it for good.
            self.mux.discard(node)
            inbox.release(effects.turn_id)
            node.state = AgentState.WAITING if node.waiting_on else AgentState.IDLE
            failed: dict[str, Any] = {
                "agent_id": node.agent_id,
                "turn_id": effects.turn_id,
                "error": failure_reason(exc),  # as the log's turn.failed says it
            }
            if isinstance(exc, OutcomeUnknownError):
                failed["undecided"] = True  # its turn.complete may survive a crash
            else:
                # nothing committed: nothing to apply. An undecided turn stays unsettled
                # (its commit, effects unapplied, may be in the log), so no checkpoint
                # of this agent forgets what a restart must roll forward
                self._settle(node, number)
            self.emit("turn.failed", failed)
            raise
        finally:
            context.effects = None
            context.on_status = None
            self.scheduler.release(node.session_id)
            self.mux.release(node)
        self.last_complete_seq[node.agent_id] = outcome.complete_seq
        node.lost_turn = None
        committed = effects.to_dict()
        self.apply_committed(node, number, effects.turn_id, committed)
        self._settle(node, number)
        result = TurnResult(
            agent_id=node.agent_id,
            turn_id=effects.turn_id,
            response=outcome.response,
            spawned=[s["agent_id"] for s in effects.spawns],
            messages_sent=[m["message_id"] for m in effects.messages],
            prompt=prompt,
            effects=committed,
            transcript=outcome.transcript,
        )
        self.emit("turn.completed", result.to_dict())
        self.checkpointer.poke()
        return result

    # -- termination ---------------------------------------------------------------

    async def terminate(self, agent: str, *, cascade: bool = False) -> list[str]:
        """Terminate an agent. One with live children needs ``cascade=True``.

        Returns the terminated agent ids, leaves first.
        """
        node = self.resolve_live(agent)
        path = self.tree.path(node.agent_id)
        if node.children and not cascade:
            children = [self.tree.path(c.agent_id) for c in self.tree.children(node.agent_id)]
            raise HasChildrenError(
                f"agent {path} has {plural(len(children), 'live child', 'live children')} "
                f"({', '.join(children)}); terminate them first or pass cascade=True"
            ).with_details(agent=path, children=children)
        for member in self.tree.subtree_leaves_first(node.agent_id):
            if member.state is AgentState.BUSY:
                busy = self.tree.path(member.agent_id)
                raise AgentBusyError(
                    f"agent {busy} is running a turn; retry when idle"
                ).with_details(agent=busy)
        gone = self.terminate_now(node.agent_id)
        self.checkpointer.poke()
        return gone

    def forget(self, node: AgentNode) -> None:
        """Drop a terminated agent from memory and mark its record TERMINATED; called
        again after its record's write failed (see ``CommitMixin.terminate_now``)."""
        live = self.mux.discard(node)
        if live is not None:
            stop_later(live)
        node.state = AgentState.TERMINATED
        if node.agent_id in self.tree:
            parent = None if node.parent_id is None else self.tree.get(node.parent_id).session_id
            self.graveyard.buried(
                TerminatedAgent(
                    node.agent_id,
                    node.session_id,
                    node.name,
                    parent,
                    node.provider,
                    node.model,
                    self.clock(),
                )
            )
            self.tree.remove(node.agent_id)
        session = self.sessions.get(node.session_id)
        if session is not None and session.state is not SessionState.TERMINATED:
            self.store.transition(session, SessionState.TERMINATED)
        self.sessions.pop(node.session_id, None)
        self.inboxes.drop(node.agent_id)
        self.logs.close(node.session_id)
        self._contexts.pop(node.agent_id, None)
        # per-agent counters go too: a long-lived daemon must not grow with every dead agent
        self.turn_counts.pop(node.agent_id, None)
        self.settled_turns.pop(node.agent_id, None)
        self.last_complete_seq.pop(node.agent_id, None)
        self.checkpointer.forget(node.session_id)
        for other in self.tree.walk():
            stale = [m for m, r in other.waiting_on.items() if r == node.agent_id]
            for message_id in stale:
                del other.waiting_on[message_id]
            if stale and not other.waiting_on and other.state is AgentState.WAITING:
                other.state = AgentState.IDLE
        self.emit("agent.terminated", {"agent_id": node.agent_id, "name": node.name})


guard(Orchestrator, API)  # every public method checks its caller first
