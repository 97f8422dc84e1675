"""``substrat demo``: a daemon killed with SIGKILL mid-run, restarted, and what came back.

Also home of the ``paced`` provider: the scripted provider with a pause between
streamed chunks, so a demo (or a crash test) can kill the daemon while a turn is
visibly in flight. Its model name is the pause, e.g. ``"40ms"``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

from substrat.providers.base import AgentContext, ProviderSession, TurnRecord
from substrat.providers.scripted import ScriptedProvider

DEFAULT_PACE = "20ms"
MAX_PACE_MS = 10_000
_PACE = re.compile(r"(\d{1,5})ms")


def pace_seconds(model: str) -> float:
    """The pause per chunk a ``paced`` model name asks for; ValueError if malformed."""
    match = _PACE.fullmatch(model)
    if match is None or int(match.group(1)) > MAX_PACE_MS:
        raise ValueError(
            f"paced model {model!r} must be a pause like '40ms' (at most {MAX_PACE_MS}ms)"
        )
    return int(match.group(1)) / 1000.0


class PacedSession:
    def __init__(self, inner: ProviderSession, pause_s: float) -> None:
        self._inner = inner
        self._pause_s = pause_s

    async def send(self, prompt: str) -> AsyncIterator[str]:
        async for chunk in self._inner.send(prompt):
            await asyncio.sleep(self._pause_s)
            yield chunk

    def last_transcript(self) -> list[dict[str, Any]]:
        return self._inner.last_transcript()

    async def suspend(self) -> bytes:
        return await self._inner.suspend()

    async def stop(self) -> None:
        await self._inner.stop()


class PacedProvider:
    """Scripted behaviour, streamed slowly (see the module docstring)."""

    name = "paced"
    default_model = DEFAULT_PACE

    def __init__(self) -> None:
        self._scripted = ScriptedProvider()

    def models(self) -> list[str]:
        return [DEFAULT_PACE, "5ms", "100ms"]

    async def create(
        self, model: str, system_prompt: str, context: AgentContext
    ) -> ProviderSession:
        inner = await self._scripted.create(model, system_prompt, context)
        return PacedSession(inner, pace_seconds(model))

    async def restore(
        self,
        blob: bytes,
        history: list[TurnRecord],
        *,
        model: str,
        system_prompt: str,
        context: AgentContext,
    ) -> ProviderSession:
        inner = await self._scripted.restore(
            blob, history, model=model, system_prompt=system_prompt, context=context
        )
        return PacedSession(inner, pace_seconds(model))
