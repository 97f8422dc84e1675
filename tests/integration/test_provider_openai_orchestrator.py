"""The openai provider inside the orchestrator: real tools, a real log, a crash mid tool round.

A crash is simulated in-process: a ``BaseException`` that nothing in substrat
catches stops the turn dead (no ``turn.failed`` is written), the orchestrator
object is abandoned with its files as a killed process leaves them (the page
cache survives a process crash), and :meth:`Orchestrator.open` on the same
root recovers. The next request the endpoint sees must be accepted and equal
the conversation the log holds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from oracle.kill import abandon
from substrat.errors import ProviderRejectedError
from substrat.orchestrator import Orchestrator
from substrat.providers.base import AgentContext, ProviderSession, ToolSpec, TurnRecord
from substrat.providers.chat_history import conversation_problems, rebuild
from substrat.providers.openai_chat import OpenAIConfig, OpenAIProvider
from substrat.providers.registry import ProviderRegistry
from tests.support.chat_server import ChatServer, Reply, echo, error, text, tool_call, tools
from tests.support.context import SimulatedCrash

SYSTEM = "You lead the team."
WORK = "Hire a helper and greet the user."


def responder(body: dict[str, Any]) -> Reply:
    """Deterministic by conversation state, so the same work can run again after a cut."""
    messages = body["messages"]
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not messages[users[-1]]["content"].endswith(WORK):
        return echo(body)
    rounds = sum(1 for m in messages[users[-1] :] if m.get("tool_calls"))
    if rounds == 0:
        return tools(
            tool_call("spawn_agent", {"name": "helper", "instructions": "help"}),
            tool_call("send_message", {"recipient": "user", "text": "hello from the lead"}),
            say="On it.",
        )
    if rounds == 1:
        return tools(tool_call("list_children", {}))
    return text("Helper hired, user greeted.", chunk_chars=4)


class CutContext:
    """Delegates to the orchestrator's context; dies before or after the n-th tool call."""

    def __init__(self, inner: AgentContext, cut: tuple[str, int] | None) -> None:
        self._inner = inner
        self._cut = cut
        self._seen = 0

    @property
    def session_id(self) -> str:
        return self._inner.session_id

    @property
    def agent_name(self) -> str:
        return self._inner.agent_name

    def tool_specs(self) -> list[ToolSpec]:
        return self._inner.tool_specs()

    def note(self, event: str, data: dict[str, Any]) -> None:
        self._inner.note(event, data)

    def report(self, event: str, data: dict[str, Any]) -> None:
        self._inner.report(event, data)

    async def call_tool(self, name: str, arguments: dict[str, Any], call_id: str) -> str:
        index, self._seen = self._seen, self._seen + 1
        if self._cut == ("before_tool", index):
            raise SimulatedCrash
        result = await self._inner.call_tool(name, arguments, call_id)
        if self._cut == ("after_tool", index):
            raise SimulatedCrash
        return result


class CuttingOpenAI(OpenAIProvider):
    """The real provider; only the context it is handed is wrapped."""

    def __init__(self, config: OpenAIConfig, cut: tuple[str, int] | None) -> None:
        super().__init__(config)
        self.cut = cut

    async def create(
        self, model: str, system_prompt: str, context: AgentContext
    ) -> ProviderSession:
        return await super().create(model, system_prompt, CutContext(context, self.cut))

    async def restore(
        self,
        blob: bytes,
        history: list[TurnRecord],
        *,
        model: str,
        system_prompt: str,
        context: AgentContext,
    ) -> ProviderSession:
        return await super().restore(
            blob,
            history,
            model=model,
            system_prompt=system_prompt,
            context=CutContext(context, self.cut),
        )


def registry_for(server: ChatServer, cut: tuple[str, int] | None = None) -> ProviderRegistry:
    config = OpenAIConfig(base_url=server.base_url, api_key="k", request_timeout_s=5.0)
    registry = ProviderRegistry()
    registry.register("openai", CuttingOpenAI(config, cut))
    return registry


CUTS = [
    ("chunk", 0),
    ("before_tool", 0),
    ("after_tool", 0),
    ("before_tool", 1),
    ("after_tool", 1),
    ("before_tool", 2),
    ("after_tool", 2),
    ("chunk", 5),  # inside the final answer
]


def test_a_full_turn_uses_real_tools_and_logs_the_transcript(root: Path) -> None:
    async def main(server: ChatServer) -> tuple[Any, list[TurnRecord], list[str]]:
        orch = await Orchestrator.open(root, registry=registry_for(server))
        try:
            await orch.create_root("lead", SYSTEM, provider="openai", model="m")
            result = await orch.run_turn("lead", WORK)
            inbox = [m.payload for m in orch.user_inbox()]
            return result, orch.history("lead"), inbox
        finally:
            await orch.close()

    with ChatServer(responder) as server:
        result, history, inbox = asyncio.run(main(server))
        assert not server.rejected()
        last = server.requests[-1]
    offered = {t["function"]["name"]: t["function"] for t in last.body["tools"]}
    assert {"spawn_agent", "send_message", "check_inbox", "complete"} <= set(offered)
    assert offered["check_inbox"]["parameters"] == {"type": "object", "properties": {}}
    assert result.response == "On it.\nHelper hired, user greeted."
    assert len(result.spawned) == 1
    assert "hello from the lead" in inbox
    [turn] = history
    assert rebuild(SYSTEM, history) == last.messages + [
        {"role": "assistant", "content": "Helper hired, user greeted."}
    ]
    assert [m["role"] for m in turn.transcript].count("tool") == 3


@pytest.mark.parametrize("cut", CUTS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_a_crash_mid_tool_round_recovers_to_the_logged_conversation(
    root: Path, cut: tuple[str, int]
) -> None:
    async def before_crash(server: ChatServer) -> None:
        orch = await Orchestrator.open(root, registry=registry_for(server, cut))
        await orch.create_root("lead", SYSTEM, provider="openai", model="m")
        await orch.run_turn("lead", "warm up")
        seen = 0

        def on_chunk(_: str) -> None:
            nonlocal seen
            if cut == ("chunk", seen):
                raise SimulatedCrash
            seen += 1

        with pytest.raises(SimulatedCrash):
            await orch.run_turn("lead", WORK, on_chunk=on_chunk)
        abandon(orch)  # no close(): the process is dead; its files stay as they are

    async def after_crash(server: ChatServer) -> tuple[Any, list[TurnRecord], list[str]]:
        orch = await Orchestrator.open(root, registry=registry_for(server))
        try:
            report = orch.recovery_report
            assert report is not None and len(report.lost_turns) == 1
            # All or nothing: the cut turn's spawn and message did not happen.
            assert [a.name for a in orch.agents()] == ["lead"]
            assert orch.user_inbox() == []
            accepted_before = len(server.accepted())
            await orch.run_turn("lead", "What happened?")
            assert len(server.accepted()) == accepted_before + 1
            await orch.run_turn("lead", WORK)  # the work again, uncut
            inbox = [m.payload for m in orch.user_inbox()]
            return orch.get("lead"), orch.history("lead"), inbox
        finally:
            await orch.close()

    with ChatServer(responder) as server:
        asyncio.run(before_crash(server))
        warm_up = server.accepted()[0]
        sent_before = len(server.requests)
        lead, history, inbox = asyncio.run(after_crash(server))
        assert not server.rejected(), server.rejected()[0].problem
        first_after = server.requests[sent_before]
        last = server.requests[-1]

    for turn, prompt in zip(history, ("warm up", "What happened?", WORK), strict=True):
        assert turn.prompt.endswith(prompt)
    # What the endpoint was sent before the crash, minus only the in-flight turn.
    assert first_after.messages == warm_up.messages + [
        history[0].transcript[-1],
        history[1].transcript[0],
    ]
    assert "was lost in flight" in history[1].transcript[0]["content"]
    assert first_after.messages == rebuild(SYSTEM, history[:1]) + [history[1].transcript[0]]
    assert last.messages + [history[2].transcript[-1]] == rebuild(SYSTEM, history)
    assert len(lead.children) == 1 and inbox == ["hello from the lead"]
    assert conversation_problems(SYSTEM, history) == []


def test_an_evicted_openai_agent_comes_back_from_its_blob(root: Path) -> None:
    async def main(server: ChatServer) -> list[TurnRecord]:
        orch = await Orchestrator.open(root, registry=registry_for(server))
        try:
            await orch.create_root("lead", SYSTEM, provider="openai", model="m")
            await orch.run_turn("lead", "one")
            assert await orch.evict("lead")
            await orch.run_turn("lead", "two")
            return orch.history("lead")
        finally:
            await orch.close()

    with ChatServer() as server:
        history = asyncio.run(main(server))
        last = server.requests[-1]
    assert last.messages == rebuild(SYSTEM, history[:1]) + [{"role": "user", "content": "two"}]


def test_a_rejected_turn_is_reported_and_the_agent_keeps_working(root: Path) -> None:
    async def main(server: ChatServer) -> list[TurnRecord]:
        orch = await Orchestrator.open(root, registry=registry_for(server))
        try:
            await orch.create_root("lead", SYSTEM, provider="openai", model="m")
            await orch.run_turn("lead", "one")
            server.script(error(401, "invalid api key"))
            with pytest.raises(ProviderRejectedError, match="invalid api key"):
                await orch.run_turn("lead", "two")
            await orch.run_turn("lead", "three")
            return orch.history("lead")
        finally:
            await orch.close()

    with ChatServer() as server:
        history = asyncio.run(main(server))
        assert not server.rejected()
        last = server.requests[-1]
    assert [t.prompt for t in history] == ["one", "three"]
    assert last.messages == rebuild(SYSTEM, history[:1]) + [{"role": "user", "content": "three"}]
