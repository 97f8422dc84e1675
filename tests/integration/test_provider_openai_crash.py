"""A tool-call round cut at every point: crash (restore from the log) and abort (same session).

The turn under test has three requests: text plus two tool calls, one more
tool call, then the final answer. It is cut at every streamed chunk, before
and after every tool call, after the stream ended but before the turn was
logged, and while a request is in flight. Each time the conversation that
reaches the server next must be accepted (no orphan tool call) and equal the
log: everything the endpoint was sent before, minus the cut turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from substrat.providers.base import ProviderSession, TurnRecord
from substrat.providers.chat_history import rebuild
from substrat.providers.openai_chat import OpenAIConfig, OpenAIProvider
from tests.support.chat_server import ChatServer, Reply, echo, text, tool_call, tools
from tests.support.context import RecordingContext, SimulatedCrash
from tests.support.directive_chat import plain_http_client

SYSTEM = "sweep"
WORK = "do the work"


def responder(body: dict[str, Any]) -> Reply:
    """Deterministic by conversation state, so a re-run after a cut behaves the same."""
    messages = body["messages"]
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if messages[users[-1]]["content"] != WORK:
        return echo(body)
    rounds = sum(1 for m in messages[users[-1] :] if m.get("tool_calls"))
    if rounds == 0:
        return tools(
            tool_call("echo", {"text": "a"}),
            tool_call("add", {"a": 1, "b": 2}),
            say="Working on it, step one.",
        )
    if rounds == 1:
        return tools(tool_call("echo", {"text": "b"}))
    return text("All done: a, 3, b.", chunk_chars=3)


@dataclass(frozen=True)
class Cut:
    kind: str  # "chunk" | "before_tool" | "after_tool" | "after_stream"
    index: int

    def __str__(self) -> str:
        return f"{self.kind}-{self.index}"


def count_points() -> tuple[int, int]:
    """How many chunks and tool calls the uncut turn has (measured, not assumed)."""

    async def main() -> tuple[int, int]:
        with ChatServer(responder) as server:
            provider = make_provider(server)
            context = RecordingContext()
            session = await provider.create("m", SYSTEM, context)
            chunks = [c async for c in session.send(WORK)]
            await session.stop()
            return len(chunks), len(context.calls)

    return asyncio.run(main())


CHUNKS, TOOL_CALLS = 12, 3
"""What :func:`count_points` measures of the uncut turn: its chunks and its tool calls.

Written down rather than measured as the module is imported: measuring runs the turn
(a server, the provider and the OpenAI SDK's import), which every pytest process paid
at collection, each xdist worker again (docs/benchmarks.md, the collection's CPU).
:func:`test_the_cuts_cover_every_point_of_the_turn` measures them and fails, with the
new numbers, when the turn changes."""


def test_the_cuts_cover_every_point_of_the_turn() -> None:
    chunks, calls = count_points()
    assert chunks >= 5 and calls == 3, (chunks, calls)
    assert (chunks, calls) == (CHUNKS, TOOL_CALLS), (
        f"the turn now has {chunks} chunks and {calls} tool calls, the cuts cover "
        f"{CHUNKS} and {TOOL_CALLS}: set CHUNKS, TOOL_CALLS = {chunks}, {calls}"
    )


def cuts() -> Iterator[Cut]:
    for index in range(CHUNKS):
        yield Cut("chunk", index)
    for index in range(TOOL_CALLS):
        yield Cut("before_tool", index)
        yield Cut("after_tool", index)
    yield Cut("after_stream", 0)


def make_provider(server: ChatServer) -> OpenAIProvider:
    config = OpenAIConfig(base_url=server.base_url, api_key="k", request_timeout_s=5.0)
    return OpenAIProvider(config, http_client=plain_http_client)


class CuttingContext(RecordingContext):
    def __init__(self, cut: Cut) -> None:
        super().__init__()
        self.cut = cut
        self.seen = 0

    async def call_tool(self, name: str, arguments: dict[str, Any], call_id: str) -> str:
        index, self.seen = self.seen, self.seen + 1
        if self.cut == Cut("before_tool", index):
            raise SimulatedCrash
        result = await super().call_tool(name, arguments, call_id)
        if self.cut == Cut("after_tool", index):
            raise SimulatedCrash  # the tool ran; its result never reached the model
        return result


async def cut_turn(session: ProviderSession, cut: Cut) -> None:
    received = 0
    async for _ in session.send(WORK):
        if cut == Cut("chunk", received):
            raise SimulatedCrash
        received += 1
    if cut.kind == "after_stream":
        raise SimulatedCrash  # answered in full, but the turn was never logged


async def complete(session: ProviderSession, prompt: str, log: list[TurnRecord]) -> None:
    response = "".join([c async for c in session.send(prompt)])
    log.append(TurnRecord(f"t{len(log) + 1}", prompt, response, session.last_transcript()))


ALL_CUTS = list(cuts())


@pytest.mark.parametrize("cut", ALL_CUTS, ids=str)
def test_crash_at_every_point_of_a_tool_round_recovers_from_the_log(cut: Cut) -> None:
    async def main(server: ChatServer) -> list[TurnRecord]:
        provider = make_provider(server)
        log: list[TurnRecord] = []
        session = await provider.create("m", SYSTEM, CuttingContext(cut))
        await complete(session, "warm up", log)
        with pytest.raises(SimulatedCrash):
            await cut_turn(session, cut)
        # The process is gone: a new one restores from the log alone.
        restored = await provider.restore(
            b"", log, model="m", system_prompt=SYSTEM, context=RecordingContext()
        )
        await complete(restored, WORK, log)  # the same work again, uncut
        await complete(restored, "thanks", log)
        await restored.stop()
        return log

    with ChatServer(responder) as server:
        log = asyncio.run(main(server))
        assert not server.rejected(), server.rejected()[0].problem
        last = server.requests[-1]
    assert last.messages == rebuild(SYSTEM, log[:-1]) + [{"role": "user", "content": "thanks"}]
    # The retried turn ran its tools for real again (the cut turn committed nothing).
    assert [m["role"] for m in log[1].transcript].count("tool") == 3


# After the stream ended the provider has committed the turn; a failure past that
# point is the orchestrator's (it discards the live session and restores from the log).
ABORT_CUTS = [cut for cut in ALL_CUTS if cut.kind != "after_stream"]


@pytest.mark.parametrize("cut", ABORT_CUTS, ids=str)
def test_abort_at_every_point_of_a_tool_round_keeps_the_live_session_valid(cut: Cut) -> None:
    async def main(server: ChatServer) -> list[TurnRecord]:
        provider = make_provider(server)
        log: list[TurnRecord] = []
        session = await provider.create("m", SYSTEM, CuttingContext(cut))
        await complete(session, "warm up", log)
        with pytest.raises(SimulatedCrash):
            await cut_turn(session, cut)
        await complete(session, "after the abort", log)  # the same live session
        await session.stop()
        return log

    with ChatServer(responder) as server:
        log = asyncio.run(main(server))
        assert not server.rejected()
        last = server.requests[-1]
    assert last.messages == rebuild(SYSTEM, log[:1]) + [
        {"role": "user", "content": "after the abort"}
    ]


def test_cancelled_while_a_request_hangs_then_recovers() -> None:
    async def main(server: ChatServer) -> list[TurnRecord]:
        provider = make_provider(server)
        log: list[TurnRecord] = []
        session = await provider.create("m", SYSTEM, RecordingContext())
        await complete(session, "warm up", log)
        server.script(
            tools(tool_call("echo", {"text": "x"}, "c_hang")), Reply(hang=True)
        )  # the request after the tool result never answers
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(complete(session, "hang please", log), timeout=1.0)
        server.release()
        await complete(session, "again", log)
        restored = await provider.restore(
            b"", log, model="m", system_prompt=SYSTEM, context=RecordingContext()
        )
        await complete(restored, "and after a restart", log)
        await session.stop()
        await restored.stop()
        return log

    with ChatServer() as server:
        log = asyncio.run(main(server))
        assert not server.rejected()
        before_restart = server.requests[-2]
        after_restart = server.requests[-1]
    assert [t.prompt for t in log] == ["warm up", "again", "and after a restart"]
    assert after_restart.messages == before_restart.messages + [
        log[1].transcript[-1],
        {"role": "user", "content": "and after a restart"},
    ]
