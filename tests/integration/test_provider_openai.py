"""The openai provider against a real chat-completions server on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from substrat import events
from substrat.errors import (
    ContextOverflowError,
    ProviderConfigError,
    ProviderError,
    ProviderRejectedError,
    ProviderUnavailableError,
)
from substrat.providers.base import ProviderSession, TurnRecord
from substrat.providers.chat_history import ORPHAN_RESULT_TEXT
from substrat.providers.openai_chat import OpenAIConfig, OpenAIProvider, OpenAISession
from tests.support.chat_server import (
    ChatServer,
    Reply,
    conversation_problem,
    error,
    overflow,
    rate_limited,
    text,
    tool_call,
    tools,
)
from tests.support.context import RecordingContext, RecordingSleep, SimulatedCrash

SYSTEM = "You are a careful test agent."


@pytest.fixture
def server() -> Iterator[ChatServer]:
    with ChatServer() as running:
        yield running


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


# -- streaming and the request --------------------------------------------------


def test_streams_text_in_chunks_and_offers_agent_tools(server: ChatServer) -> None:
    server.script(text("The answer is forty-two.", chunk_chars=4))
    provider, _ = make_provider(server)
    context = RecordingContext()

    async def main() -> tuple[str, list[str]]:
        session = await provider.create("test-model", SYSTEM, context)
        try:
            return await turn(session, "What is the answer?")
        finally:
            await session.stop()

    response, chunks = run(main())
    assert response == "The answer is forty-two."
    assert len(chunks) >= 6  # streamed, not buffered
    [request] = server.requests
    body = request.body
    assert body["model"] == "test-model" and body["stream"] is True
    assert body["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the answer?"},
    ]
    offered = {t["function"]["name"]: t for t in body["tools"]}
    assert set(offered) == {"echo", "add"}
    assert offered["add"]["type"] == "function"
    assert offered["add"]["function"]["parameters"]["required"] == ["a", "b"]


def test_tool_calls_run_through_the_context_and_results_go_back(server: ChatServer) -> None:
    server.script(
        tools(tool_call("add", {"a": 2, "b": 3}, "call_A"), tool_call("echo", {"text": "hi"})),
        text("Two plus three is 5, and you said hi."),
    )
    provider, _ = make_provider(server)
    context = RecordingContext()

    async def main() -> tuple[str, list[dict[str, Any]]]:
        session = await provider.create("m", SYSTEM, context)
        response, _ = await turn(session, "add 2 and 3, then echo hi")
        return response, session.last_transcript()

    response, transcript = run(main())
    assert response == "Two plus three is 5, and you said hi."
    # The model's own call ids are the idempotency keys.
    assert context.calls[0] == ("add", {"a": 2, "b": 3}, "call_A")
    assert context.calls[1][:2] == ("echo", {"text": "hi"})
    first, second = server.requests
    assert second.messages[: len(first.messages)] == first.messages
    answer, result_a, result_b = second.messages[len(first.messages) :]
    assert answer["role"] == "assistant" and answer["content"] is None
    assert [c["id"] for c in answer["tool_calls"]] == ["call_A", context.calls[1][2]]
    assert result_a == {"role": "tool", "tool_call_id": "call_A", "content": "5"}
    assert result_b["tool_call_id"] == context.calls[1][2] and result_b["content"] == "hi"
    # The transcript is exactly what this turn added to the conversation.
    assert transcript == second.messages[1:] + [
        {"role": "assistant", "content": "Two plus three is 5, and you said hi."}
    ]
    assert not server.rejected()


def test_bad_tool_arguments_come_back_as_an_error_the_model_can_read(server: ChatServer) -> None:
    server.script(tools(tool_call("add", "{not json", "call_bad")), text("sorry"))
    provider, _ = make_provider(server)
    context = RecordingContext()

    async def main() -> None:
        session = await provider.create("m", "", context)
        await turn(session, "add")

    run(main())
    assert context.calls == []
    result = server.requests[1].messages[-1]
    assert result["role"] == "tool" and result["tool_call_id"] == "call_bad"
    assert "not valid JSON" in result["content"]


def test_reused_call_ids_are_made_unique(server: ChatServer) -> None:
    # Some local servers number calls from zero in every answer.
    server.script(
        tools(tool_call("echo", {"text": "one"}, "call_0")),
        tools(tool_call("echo", {"text": "two"}, "call_0")),
        text("done"),
    )
    provider, _ = make_provider(server)
    context = RecordingContext()

    async def main() -> None:
        session = await provider.create("m", "", context)
        await turn(session, "echo twice")

    run(main())
    ids = [call_id for _, _, call_id in context.calls]
    assert len(ids) == 2 and len(set(ids)) == 2
    assert [r for _, r, _ in context.calls] == [{"text": "one"}, {"text": "two"}]
    assert not server.rejected()


# -- recovery: the log is the only copy ----------------------------------------------


def test_a_conversation_rebuilt_from_the_log_is_what_the_endpoint_was_sent(
    server: ChatServer,
) -> None:
    server.script(
        text("hello"),
        tools(tool_call("add", {"a": 1, "b": 1}, "c1"), say="let me add"),
        tools(tool_call("echo", {"text": "x"}, "c2")),
        text("it is 2"),
        text("third answer"),
        text("fourth answer"),
    )
    provider, _ = make_provider(server)
    log = TurnLog()

    async def main() -> None:
        original = await provider.create("m", SYSTEM, RecordingContext())
        for prompt in ("hi", "what is 1+1?", "and now?"):
            await log.run(original, prompt)
        await original.stop()  # the process dies; only the log is left
        restored = await provider.restore(
            b"", log.turns, model="m", system_prompt=SYSTEM, context=RecordingContext()
        )
        await turn(restored, "go on")

    run(main())
    before_crash = server.requests[4]  # the last request of the last completed turn
    after = server.requests[5]
    assert after.messages == before_crash.messages + [
        {"role": "assistant", "content": "third answer"},
        {"role": "user", "content": "go on"},
    ]
    assert not server.rejected()


def test_a_crash_inside_a_tool_round_recovers_to_an_accepted_conversation(
    server: ChatServer,
) -> None:
    server.script(
        text("first"),
        tools(tool_call("echo", {"text": "boom"}, "c_inflight")),
        text("fresh start"),
    )
    provider, _ = make_provider(server)
    log = TurnLog()
    context = RecordingContext()

    def crash(name: str, args: dict[str, Any], call_id: str) -> None:
        if call_id == "c_inflight":
            raise SimulatedCrash

    context.before_call = crash

    async def main() -> None:
        original = await provider.create("m", SYSTEM, context)
        await log.run(original, "one")
        with pytest.raises(SimulatedCrash):
            await log.run(original, "two")  # dies while the tool runs
        restored = await provider.restore(
            b"", log.turns, model="m", system_prompt=SYSTEM, context=RecordingContext()
        )
        await turn(restored, "three")

    run(main())
    assert len(log.turns) == 1
    last = server.requests[-1]
    assert last.status == 200 and not server.rejected()
    # Minus only the in-flight turn: turn 1, then the new prompt.
    assert last.messages == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "three"},
    ]


def test_a_failed_turn_leaves_the_live_conversation_unchanged(server: ChatServer) -> None:
    server.script(
        text("first"),
        tools(tool_call("echo", {"text": "x"}, "c9")),
        error(401, "bad key"),
        text("after"),
    )
    provider, _ = make_provider(server)

    async def main() -> OpenAISession:
        session = await provider.create("m", "", RecordingContext())
        assert isinstance(session, OpenAISession)
        await turn(session, "one")
        with pytest.raises(ProviderRejectedError):
            await turn(session, "two")
        await turn(session, "three")
        return session

    session = run(main())
    assert server.requests[-1].messages == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "three"},
    ]
    assert session.messages[-1] == {"role": "assistant", "content": "after"}


def test_orphan_tool_calls_in_the_history_are_repaired_and_the_repair_is_logged(
    server: ChatServer,
) -> None:
    # A transcript cut inside a tool round (an older version, or a hand-edited log).
    damaged = TurnRecord(
        "t1",
        "look",
        "",
        [
            {"role": "user", "content": "look"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "echo", "arguments": "{}"},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "echo", "arguments": "{}"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
    )
    server.script(text("accepted"))
    provider, _ = make_provider(server)
    context = RecordingContext()

    async def main() -> None:
        session = await provider.restore(
            b"", [damaged], model="m", system_prompt="", context=context
        )
        await turn(session, "next")

    run(main())
    # The same history sent as it is: the server refuses it, as real endpoints do.
    unrepaired = {"model": "m", "messages": [*damaged.transcript, {"role": "user", "content": "x"}]}
    assert conversation_problem(unrepaired) is not None
    [request] = server.requests
    assert request.status == 200
    assert request.messages[3] == {
        "role": "tool",
        "tool_call_id": "c2",
        "content": ORPHAN_RESULT_TEXT,
    }
    [(event, data)] = context.notes
    assert event == events.TOOL_REPAIRED and data["synthesized"] == ["c2"]


# -- the blob fast path ----------------------------------------------------------------


def test_suspend_and_restore_from_a_current_blob(server: ChatServer) -> None:
    provider, _ = make_provider(server)
    log = TurnLog()

    async def main() -> tuple[list[Any], list[Any]]:
        session = await provider.create("m", SYSTEM, RecordingContext())
        await log.run(session, "a")
        await log.run(session, "b")
        assert isinstance(session, OpenAISession)
        before = session.messages
        blob = await session.suspend()
        restored = await provider.restore(
            blob, [], model="m", system_prompt=SYSTEM, context=RecordingContext()
        )
        assert isinstance(restored, OpenAISession)
        also = await provider.restore(
            blob, log.turns, model="m", system_prompt=SYSTEM, context=RecordingContext()
        )
        assert isinstance(also, OpenAISession)
        assert also.messages == before
        return before, restored.messages

    before, after = run(main())
    assert after == before


def test_a_stale_or_damaged_blob_is_refused_so_the_log_is_used(server: ChatServer) -> None:
    provider, _ = make_provider(server)
    log = TurnLog()

    async def main() -> None:
        session = await provider.create("m", "", RecordingContext())
        await log.run(session, "a")
        stale = await session.suspend()
        session = await provider.restore(
            stale, [], model="m", system_prompt="", context=RecordingContext()
        )
        await log.run(session, "b")
        with pytest.raises(ProviderError, match="older than the log"):
            await provider.restore(
                stale, log.turns, model="m", system_prompt="", context=RecordingContext()
            )
        for bad in (b"\x00garbage", b'{"version": 99}', b'{"version": 1, "messages": 3}'):
            with pytest.raises(ProviderError, match="unreadable"):
                await provider.restore(
                    bad, [], model="m", system_prompt="", context=RecordingContext()
                )

    run(main())


# -- transient errors: retried with backoff and jitter, within a bound ------------------------


@pytest.mark.parametrize(
    "failure",
    [
        rate_limited(0.25),
        error(500, "internal"),
        error(503, "overloaded"),
        Reply(drop="before_headers"),
        Reply(text="partial answer", drop="mid_stream", drop_after_chunks=2),
        Reply(text="partial answer", finish=False),
    ],
    ids=["429", "500", "503", "drop-before-headers", "drop-mid-stream", "no-finish-reason"],
)
def test_transient_failures_are_retried(server: ChatServer, failure: Reply) -> None:
    server.script(failure, failure, text("partial answer, then all of it"))
    provider, sleep = make_provider(server, max_retries=3)

    async def main() -> tuple[str, list[str]]:
        session = await provider.create("m", "", RecordingContext())
        return await turn(session, "hello")

    response, _ = run(main())
    # Text already streamed before a cut is not streamed twice.
    assert response == "partial answer, then all of it"
    assert len(server.requests) == 3 and len(sleep.delays) == 2
    if failure.status == 429:
        assert all(d >= 0.25 for d in sleep.delays)  # Retry-After is honoured


def test_a_read_timeout_is_retried(server: ChatServer) -> None:
    server.script(Reply(text="late", delay_s=2.0), text("on time"))
    provider, sleep = make_provider(server, request_timeout_s=0.3)

    async def main() -> str:
        session = await provider.create("m", "", RecordingContext())
        response, _ = await turn(session, "hello")
        return response

    assert run(main()) == "on time"
    assert len(sleep.delays) == 1


def test_the_retry_budget_is_bounded_and_the_error_says_so(server: ChatServer) -> None:
    server.responder = lambda body: error(502, "bad gateway")
    provider, sleep = make_provider(server, max_retries=4, backoff_base_s=1.0, backoff_cap_s=3.0)

    async def main() -> None:
        session = await provider.create("m", "", RecordingContext())
        await turn(session, "hello")

    with pytest.raises(ProviderUnavailableError, match=r"after 4 retries.*HTTP 502"):
        run(main())
    assert len(server.requests) == 5
    assert len(sleep.delays) == 4
    # Capped exponential with jitter: each wait lies in [ceiling/2, ceiling].
    for attempt, delay in enumerate(sleep.delays, start=1):
        ceiling = min(3.0, 1.0 * 2 ** (attempt - 1))
        assert ceiling / 2 <= delay <= ceiling


def test_a_retry_that_answers_differently_after_partial_output_fails_the_turn(
    server: ChatServer,
) -> None:
    server.script(
        Reply(text="The cat sat", drop="mid_stream", drop_after_chunks=2, chunk_chars=4),
        text("A dog ran off"),
    )
    provider, _ = make_provider(server)

    async def main() -> None:
        session = await provider.create("m", "", RecordingContext())
        await turn(session, "story")

    with pytest.raises(ProviderUnavailableError, match="answered differently"):
        run(main())


# -- permanent errors and context overflow ---------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_permanent_errors_are_not_retried(server: ChatServer, status: int) -> None:
    server.script(error(status, f"refused with {status}"))
    provider, sleep = make_provider(server)

    async def main() -> None:
        session = await provider.create("m", "", RecordingContext())
        await turn(session, "hello")

    with pytest.raises(
        ProviderRejectedError, match=f"HTTP {status}.*refused with {status}"
    ) as info:
        run(main())
    assert not isinstance(info.value, ContextOverflowError)
    assert len(server.requests) == 1 and sleep.delays == []


def test_context_overflow_is_reported_as_such(server: ChatServer) -> None:
    server.script(overflow())
    provider, _ = make_provider(server)

    async def main() -> None:
        session = await provider.create("m", "", RecordingContext())
        await turn(session, "hello")

    with pytest.raises(ContextOverflowError, match="context window"):
        run(main())


def test_a_conversation_that_grows_past_the_window_overflows() -> None:
    with ChatServer(max_context_chars=400) as server:
        provider, _ = make_provider(server)

        async def main() -> int:
            session = await provider.create("m", "", RecordingContext())
            turns = 0
            with pytest.raises(ContextOverflowError):
                for _ in range(50):
                    await turn(session, "x" * 40)
                    turns += 1
            return turns

        turns = run(main())
    assert 1 <= turns < 50


# -- limits and configuration -------------------------------------------------------------


def test_the_tool_round_limit_ends_the_turn_with_a_valid_history(server: ChatServer) -> None:
    server.responder = lambda body: tools(tool_call("echo", {"text": "again"}))
    provider, _ = make_provider(server, max_tool_rounds_per_turn=3)
    context = RecordingContext()

    async def main() -> list[dict[str, Any]]:
        session = await provider.create("m", "", context)
        await turn(session, "loop forever")
        server.responder = lambda body: text("ok")
        await turn(session, "next")
        return session.last_transcript()

    run(main())
    assert len(context.calls) == 3
    final = server.requests[3]
    assert final.body["tool_choice"] == "none"
    assert "limit of 3 tool rounds" in server.requests[4].messages[-2]["content"]
    assert not server.rejected()


def test_configuration_comes_from_the_environment_with_substrat_first() -> None:
    env = {
        "OPENAI_BASE_URL": "http://generic/v1",
        "SUBSTRAT_OPENAI_BASE_URL": "http://mine/v1",
        "OPENAI_API_KEY": "generic-key",
        "SUBSTRAT_OPENAI_MODEL": "llama3",
        "SUBSTRAT_OPENAI_MAX_RETRIES": "2",
        "SUBSTRAT_OPENAI_TIMEOUT_S": "7.5",
    }
    config = OpenAIConfig.from_env(env)
    assert config.base_url == "http://mine/v1"
    assert config.api_key == "generic-key"
    assert config.default_model == "llama3"
    assert (config.max_retries, config.request_timeout_s) == (2, 7.5)
    assert OpenAIProvider(config).default_model == "llama3"
    with pytest.raises(ProviderConfigError, match="SUBSTRAT_OPENAI_MAX_RETRIES"):
        OpenAIConfig.from_env({"SUBSTRAT_OPENAI_MAX_RETRIES": "many"})
    with pytest.raises(ProviderConfigError):
        OpenAIConfig(max_tool_rounds_per_turn=0)


def test_no_key_and_no_base_url_is_a_clear_error_at_creation() -> None:
    provider = OpenAIProvider(OpenAIConfig())

    async def main() -> None:
        await provider.create("m", "", RecordingContext())

    with pytest.raises(ProviderConfigError, match="SUBSTRAT_OPENAI_API_KEY"):
        run(main())


def test_the_transcript_is_plain_json(server: ChatServer) -> None:
    server.script(tools(tool_call("echo", {"text": "é"})), text("fine"))
    provider, _ = make_provider(server)

    async def main() -> list[dict[str, Any]]:
        session = await provider.create("m", "", RecordingContext())
        await turn(session, "go")
        return session.last_transcript()

    transcript = run(main())
    assert json.loads(json.dumps(transcript)) == transcript


def test_the_default_registry_offers_both_real_providers_without_importing_the_sdk() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from substrat.providers.registry import default_registry\n"
        "registry = default_registry()\n"
        "assert {'openai', 'claude-code'} <= set(registry.names()), registry.names()\n"
        "assert 'openai' not in sys.modules\n"
        "provider = registry.get('openai')\n"
        "assert provider.name == 'openai' and 'openai' not in sys.modules\n"
        "assert registry.get('claude-code').name == 'claude-code'\n"
    )
    env = {"PATH": "/usr/bin:/bin", "SUBSTRAT_OPENAI_MODEL": "m"}
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert completed.returncode == 0, completed.stderr


def test_a_given_http_client_factory_builds_each_event_loops_client(server: ChatServer) -> None:
    import openai

    built: list[Any] = []
    sent: list[tuple[int, str]] = []

    def factory() -> Any:
        number = len(built)

        async def record(request: Any) -> None:
            sent.append((number, request.url.path))

        built.append(openai.DefaultAsyncHttpxClient(event_hooks={"request": [record]}))
        return built[-1]

    server.script(text("one"), text("two"), text("three"))
    config = OpenAIConfig(base_url=server.base_url, api_key="k", request_timeout_s=5.0)
    provider = OpenAIProvider(config, http_client=factory)

    async def two_turns() -> list[str]:
        session = await provider.create("m", SYSTEM, RecordingContext())
        try:
            return [(await turn(session, "a"))[0], (await turn(session, "b"))[0]]
        finally:
            await session.stop()

    async def one_turn() -> str:
        session = await provider.create("m", SYSTEM, RecordingContext())
        try:
            return (await turn(session, "c"))[0]
        finally:
            await session.stop()

    assert run(two_turns()) == ["one", "two"]
    assert len(built) == 1  # one client for the loop, shared by its requests
    assert run(one_turn()) == "three"  # a new event loop builds its own
    assert len(built) == 2
    # Every request went through the factory's clients, the first loop's through the first.
    assert sent == [(0, "/v1/chat/completions")] * 2 + [(1, "/v1/chat/completions")]
