"""Live provider sessions: restored when a turn needs one, suspended when evicted.

The multiplexer (:mod:`substrat.multiplexer`) keeps ``slots`` live sessions per
provider and calls these two methods of the orchestrator: :meth:`_load_session`
when an agent without a live session gets a turn, :meth:`_save_session` when its
session is evicted (or the orchestrator closes). The blob a provider hands back
is only a fast path: a restore uses it only when it is current (saved at or
after the agent's last ``turn.complete``) and the provider accepts it, and
otherwise rebuilds the conversation from the agent's log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from substrat import events
from substrat.agents import AgentNode
from substrat.conversation import conversation_from_log
from substrat.logs import LogPool
from substrat.providers.base import ProviderSession
from substrat.providers.registry import ProviderRegistry
from substrat.scheduler import failure_reason
from substrat.session import Session, SessionState, SessionStore

if TYPE_CHECKING:
    from substrat.checkpointer import Checkpointer
    from substrat.tools import AgentToolContext


class LiveSessionsMixin:
    """The session half of :class:`~substrat.orchestrator.Orchestrator` the multiplexer
    calls (see the module docstring)."""

    sessions: dict[str, Session]
    registry: ProviderRegistry
    last_complete_seq: dict[str, int]
    logs: LogPool
    store: SessionStore
    checkpointer: Checkpointer

    if TYPE_CHECKING:

        def _context(self, node: AgentNode) -> AgentToolContext: ...

    async def _load_session(self, node: AgentNode) -> ProviderSession:
        session = self.sessions[node.session_id]
        backend = self.registry.get(node.provider)
        context = self._context(node)
        current = session.state_seq >= self.last_complete_seq.get(node.agent_id, 0)
        blob = session.provider_state if current else b""
        source = "blob" if blob else "log"
        live: ProviderSession | None = None
        restored: dict[str, Any] = {"provider": node.provider, "model": node.model}
        if blob:
            try:
                live = await backend.restore(
                    blob, [], model=node.model, system_prompt=node.instructions, context=context
                )
            except Exception as exc:  # the log has it all; say why the blob was not used
                source, restored["blob_refused"] = "log", failure_reason(exc)
        if live is None:
            # the first turn after a start: recovery's read of the log has it, if the
            # log is as recovery left it (LogPool.kept_conversation says)
            history = self.logs.kept_conversation(node.session_id)
            if history is None:
                history = conversation_from_log(self.logs.path(node.session_id))
            if not history and session.state is SessionState.CREATED:
                source = "new"
                live = await backend.create(node.model, node.instructions, context)
            else:
                live = await backend.restore(
                    b"", history, model=node.model, system_prompt=node.instructions, context=context
                )
        self.logs.get(node.session_id).log(events.SESSION_RESTORED, {**restored, "source": source})
        # A session discarded after a failed turn was never suspended: still ACTIVE.
        # In memory only: the record keeps the state a restart needs (store.activate).
        if session.state is not SessionState.ACTIVE:
            self.store.activate(session)
        return live

    async def _save_session(self, node: AgentNode, live: ProviderSession) -> None:
        session = self.sessions[node.session_id]
        try:
            blob = await live.suspend()
            error = None
        except Exception as exc:  # the blob is only a fast path: the log has it all
            blob, error = b"", f"{type(exc).__name__}: {exc}"
        # fetched after the await: meanwhile the open-log bound may have closed it
        log = self.logs.get(node.session_id)
        session.provider_state = blob
        session.state_seq = log.last_seq
        self.store.transition(session, SessionState.SUSPENDED)
        data: dict[str, Any] = {"state_size": len(blob)}
        if error:
            data["error"] = error
        log.log(events.SUSPEND_RESULT, data)
        if self.checkpointer.policy.on_evict:
            self.checkpointer.due(node.session_id)
            self.checkpointer.poke()
        try:
            await live.stop()
        except Exception:
            pass
