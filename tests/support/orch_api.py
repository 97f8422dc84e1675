"""Helpers shared by the orchestrator API tests (tests/integration/test_orchestrator_*.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from substrat.eventlog import read_log
from substrat.orchestrator import Orchestrator
from substrat.providers.base import AgentContext, TurnRecord
from substrat.providers.registry import ProviderRegistry
from substrat.providers.scripted import ScriptedProvider, ScriptedSession, parse_directives
from substrat.session import SessionState, SessionStore

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def registry(**providers: Any) -> ProviderRegistry:
    reg = ProviderRegistry()
    reg.register("scripted", ScriptedProvider)
    for name, provider in providers.items():
        reg.register(name, provider)
    return reg


def log_events(orch: Orchestrator, agent: str) -> list[tuple[str, dict[str, Any]]]:
    path = orch.logs.path(orch.get(agent).session_id)
    return [(e["event"], e["data"]) for e in read_log(path).entries]


def record_state(orch: Orchestrator, session_id: str) -> SessionState:
    return SessionStore(orch.root).load(session_id).state


class Gate:
    """A script that runs directives like the built-in one, but parks a turn whose
    prompt mentions ``park`` (and is not itself a directive) until released, to hold an
    agent BUSY."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, prompt: str, turns: list[TurnRecord], ctx: AgentContext) -> str:
        if "park" in prompt and not prompt.startswith("@"):  # not the sender's own turn
            self.entered.set()
            await self.release.wait()
        lines = [f"done {prompt}"]
        for index, (tool, args) in enumerate(parse_directives(prompt)):
            lines.append(await ctx.call_tool(tool, args, f"g{len(turns)}c{index}"))
        return "\n".join(lines)


def slow_suspend_provider(gate: Gate, *, restorable: bool = False) -> ScriptedProvider:
    """A scripted provider whose sessions' suspend says it started, then waits for ``gate``.

    ``restorable``: a session restored from its blob suspends as slowly.
    """

    class SlowSuspend(ScriptedSession):
        async def suspend(self) -> bytes:
            gate.entered.set()
            await gate.release.wait()
            return await super().suspend()

    class SlowSuspendProvider(ScriptedProvider):
        async def create(self, model: str, system_prompt: str, context: AgentContext) -> Any:
            return SlowSuspend(context, [], None)

        async def restore(self, blob: bytes, history: list[TurnRecord], **kw: Any) -> Any:
            restored = await super().restore(blob, history, **kw)
            if not restorable:
                return restored
            assert isinstance(restored, ScriptedSession)
            return SlowSuspend(kw["context"], restored.turns, None)

    return SlowSuspendProvider()
