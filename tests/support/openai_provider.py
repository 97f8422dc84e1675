"""Helpers shared by the openai provider tests (tests/integration/test_provider_openai*.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from substrat.providers.base import ProviderSession, TurnRecord
from substrat.providers.openai_chat import OpenAIConfig, OpenAIProvider
from tests.support.chat_server import (
    ChatServer,
)
from tests.support.context import RecordingSleep

SYSTEM = "You are a careful test agent."


def make_provider(server: ChatServer, **changes: Any) -> tuple[OpenAIProvider, RecordingSleep]:
    sleep = RecordingSleep()
    settings: dict[str, Any] = {
        "base_url": server.base_url,
        "api_key": "test-key",
        "request_timeout_s": 5.0,
    }
    settings.update(changes)
    return OpenAIProvider(OpenAIConfig(**settings), sleep=sleep), sleep


async def turn(session: ProviderSession, prompt: str) -> tuple[str, list[str]]:
    chunks = [chunk async for chunk in session.send(prompt)]
    return "".join(chunks), chunks


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class TurnLog:
    """What the orchestrator would log: each completed turn's transcript."""

    def __init__(self) -> None:
        self.turns: list[TurnRecord] = []

    async def run(self, session: ProviderSession, prompt: str) -> str:
        response, _ = await turn(session, prompt)
        self.turns.append(
            TurnRecord(f"t{len(self.turns) + 1}", prompt, response, session.last_transcript())
        )
        return response
