"""The ``fake`` provider: the scripted provider with failures you can switch on.

For tests. Each ``fail_*`` counter makes that many upcoming calls fail with
:class:`~substrat.errors.ProviderError`; ``cut_after_chunks`` makes the next
turn stream that many chunks and then break, as a dropped connection would.
``calls`` records every call, for assertions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from substrat.errors import ProviderError
from substrat.providers.base import AgentContext, ProviderSession, TurnRecord
from substrat.providers.scripted import (
    Script,
    ScriptedProvider,
    ScriptedSession,
    one_model_only,
)


class FakeSession:
    def __init__(self, inner: ScriptedSession, provider: FakeProvider) -> None:
        self._inner = inner
        self._provider = provider

    async def send(self, prompt: str) -> AsyncIterator[str]:
        provider = self._provider
        provider.calls.append(("send", prompt))
        if provider._take("fail_send"):
            raise ProviderError("fake provider: send failed before any output")
        cut = provider.cut_after_chunks
        provider.cut_after_chunks = None
        produced = 0
        async for chunk in self._inner.send(prompt):
            if cut is not None and produced >= cut:
                raise ProviderError(f"fake provider: stream cut after {cut} chunks")
            produced += 1
            yield chunk

    def last_transcript(self) -> list[dict[str, Any]]:
        return self._inner.last_transcript()

    async def suspend(self) -> bytes:
        self._provider.calls.append(("suspend", ""))
        if self._provider._take("fail_suspend"):
            raise ProviderError("fake provider: suspend failed")
        return await self._inner.suspend()

    async def stop(self) -> None:
        self._provider.calls.append(("stop", ""))
        await self._inner.stop()


class FakeProvider:
    name = "fake"
    default_model = "fake"

    def __init__(self, script: Script | None = None) -> None:
        self._scripted = ScriptedProvider(script)
        self.fail_create = 0
        self.fail_send = 0
        self.fail_suspend = 0
        self.fail_restore = 0
        self.cut_after_chunks: int | None = None
        self.calls: list[tuple[str, str]] = []

    def _take(self, counter: str) -> bool:
        remaining: int = getattr(self, counter)
        if remaining > 0:
            setattr(self, counter, remaining - 1)
            return True
        return False

    def models(self) -> list[str]:
        return [self.default_model]

    def check_model(self, model: str) -> None:
        one_model_only(self.name, self.default_model, model)

    async def create(
        self, model: str, system_prompt: str, context: AgentContext
    ) -> ProviderSession:
        self.calls.append(("create", model))
        if self._take("fail_create"):
            raise ProviderError("fake provider: create failed")
        inner = await self._scripted.create(model, system_prompt, context)
        assert isinstance(inner, ScriptedSession)
        return FakeSession(inner, self)

    async def restore(
        self,
        blob: bytes,
        history: list[TurnRecord],
        *,
        model: str,
        system_prompt: str,
        context: AgentContext,
    ) -> ProviderSession:
        self.calls.append(("restore", "blob" if blob else "history"))
        if self._take("fail_restore"):
            raise ProviderError("fake provider: restore failed")
        inner = await self._scripted.restore(
            blob, history, model=model, system_prompt=system_prompt, context=context
        )
        assert isinstance(inner, ScriptedSession)
        return FakeSession(inner, self)
