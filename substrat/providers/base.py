"""The provider seam: what substrat needs from an LLM backend.

A :class:`Provider` makes :class:`ProviderSession` objects, one per agent. A
session streams a turn's text, may call agent tools mid-turn through the
:class:`AgentContext` it was given, and can be suspended into an opaque blob.

Recovery contract: ``restore(blob, history, ...)`` receives the conversation
rebuilt from the event log (every completed turn, in order). When ``blob`` is
empty the provider MUST rebuild its state from ``history`` alone: the
orchestrator passes an empty blob whenever the stored one is missing or older
than the log, so a provider never resumes from a stale snapshot. A provider
that cannot use a non-empty blob raises; the orchestrator then retries with an
empty blob and the full history from the log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable


# A NamedTuple, not a frozen dataclass: every daemon defines it (see rpc.lock.LockInfo)
class ToolSpec(NamedTuple):
    """An agent tool as offered to a model: name, description, JSON-schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class TurnRecord:
    """One completed turn as the log has it.

    ``transcript`` is provider-specific plain JSON (for a chat endpoint: the
    messages this turn added, tool calls and tool results included), logged in
    ``turn.complete`` so a bare-LLM conversation can be rebuilt message for
    message.
    """

    turn_id: str
    prompt: str
    response: str
    transcript: list[dict[str, Any]] = field(default_factory=list)


class AgentContext(Protocol):
    """What a provider session may use of the orchestrator during a turn."""

    @property
    def session_id(self) -> str: ...

    @property
    def agent_name(self) -> str: ...

    def tool_specs(self) -> list[ToolSpec]: ...

    async def call_tool(self, name: str, arguments: dict[str, Any], call_id: str) -> str:
        """Run an agent tool; returns the result text (errors come back as text too)."""
        ...

    def note(self, event: str, data: dict[str, Any]) -> None:
        """Ask for a provider event (e.g. ``tool.repaired``) to be logged durably."""
        ...

    def report(self, event: str, data: dict[str, Any]) -> None:
        """Tell whoever watches how the turn is going (e.g. ``turn.retrying``); not logged."""
        ...


@runtime_checkable
class ProviderSession(Protocol):
    """One live conversation with a backend."""

    def send(self, prompt: str) -> AsyncIterator[str]:
        """Run one turn: stream the response text in chunks.

        Raising (at any point, also after some chunks) fails the turn: it is
        logged as failed and nothing of it is acknowledged.
        """
        ...

    def last_transcript(self) -> list[dict[str, Any]]:
        """Plain-JSON transcript of the turn that just completed (may be empty)."""
        ...

    async def suspend(self) -> bytes:
        """Serialise the session's state; the session is not used afterwards."""
        ...

    async def stop(self) -> None:
        """Release resources (processes, connections). Idempotent."""
        ...


@runtime_checkable
class Provider(Protocol):
    """A backend that creates and restores sessions."""

    name: str
    default_model: str

    async def create(
        self, model: str, system_prompt: str, context: AgentContext
    ) -> ProviderSession: ...

    async def restore(
        self,
        blob: bytes,
        history: list[TurnRecord],
        *,
        model: str,
        system_prompt: str,
        context: AgentContext,
    ) -> ProviderSession: ...

    def models(self) -> list[str]: ...


def new_agent_model(provider: Provider, model: str | None) -> str:
    """The model of an agent being created: ``model``, else the provider's default.

    ValueError if the provider cannot run it: a provider may define
    ``check_model(model)`` for this. It is asked only when an agent is created,
    never when one is restored, so an agent made before its provider grew the
    check keeps its model and keeps working.
    """
    model = model or provider.default_model
    check = getattr(provider, "check_model", None)
    if check is not None:
        check(model)
    return model
