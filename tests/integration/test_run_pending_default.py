"""``run_pending()`` stops a conversation that never ends after its default bound.

Two agents that answer every message with another one would wake each other
forever, each turn a provider call (paid, with a real model). So
``run_pending`` runs at most ``max_turns`` turns, 100 unless told, up to
``MAX_WAKE_TURNS`` (10,000); the docs named only the latter (outside review
s21f). The caller sees the bound was reached when the count returned equals
``max_turns``, and calls again to go on.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path

from substrat.orchestrator import Orchestrator
from substrat.providers.base import AgentContext, TurnRecord
from substrat.providers.registry import ProviderRegistry
from substrat.providers.scripted import ScriptedProvider
from substrat.wake import MAX_WAKE_TURNS, WakeMixin

DOCS = Path(__file__).resolve().parents[2] / "docs" / "orchestrator.md"


async def _answer_every_message(
    prompt: str, history: list[TurnRecord], context: AgentContext
) -> str:
    if prompt == "start":
        await context.call_tool("spawn_agent", {"name": "kid", "instructions": "x"}, "c0")
        await context.call_tool("send_message", {"recipient": "kid", "text": "ping"}, "c1")
    elif "from lead/kid]" in prompt:  # the lead hears its child: answer it
        await context.call_tool("send_message", {"recipient": "kid", "text": "ping"}, "c0")
    else:  # the child hears its parent
        await context.call_tool("send_message", {"recipient": "parent", "text": "pong"}, "c0")
    return "answered"


def test_run_pending_stops_an_endless_exchange_at_its_default(root: Path) -> None:
    registry = ProviderRegistry()
    registry.register("scripted", ScriptedProvider(script=_answer_every_message))
    default = inspect.signature(WakeMixin.run_pending).parameters["max_turns"].default

    async def scenario() -> None:
        async with Orchestrator.open(root, registry=registry) as orch:
            await orch.create_root("lead", "x")
            await orch.run_turn("lead", "start")
            assert await orch.run_pending() == default  # bounded, not endless
            assert await orch.run_pending(max_turns=3) == 3  # mail was left: it goes on
            turns = sum(len(orch.history(a)) for a in ("lead", "lead/kid"))
            assert turns == 1 + default + 3

    asyncio.run(scenario())


def test_the_docs_give_run_pending_s_default_and_its_limit() -> None:
    default = inspect.signature(WakeMixin.run_pending).parameters["max_turns"].default
    text = " ".join(DOCS.read_text().split())
    assert f"`run_pending(max_turns={default})`" in text
    limits = re.search(r"`MAX_WAKE_TURNS` \(([\d ,]+) per `run_pending`", text)
    assert limits is not None and int(re.sub(r"[ ,]", "", limits[1])) == MAX_WAKE_TURNS
