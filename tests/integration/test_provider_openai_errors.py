"""The openai provider against a real chat-completions server on loopback: transient
and permanent errors, context overflow, limits and configuration."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from substrat.errors import (
    ContextOverflowError,
    ProviderConfigError,
    ProviderRejectedError,
    ProviderUnavailableError,
)
from substrat.providers.openai_chat import OpenAIConfig, OpenAIProvider
from tests.support.chat_server import (
    ChatServer,
    Reply,
    error,
    overflow,
    rate_limited,
    text,
    tool_call,
    tools,
)
from tests.support.context import RecordingContext
from tests.support.openai_provider import SYSTEM, make_provider, run, turn


@pytest.fixture
def server() -> Iterator[ChatServer]:
    with ChatServer() as running:
        yield running


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


def test_a_retry_after_longer_than_the_backoff_cap_fails_the_turn_at_once(
    server: ChatServer,
) -> None:
    server.script(rate_limited(3600), text("too soon"))
    provider, sleep = make_provider(server, max_retries=3, backoff_cap_s=20.0)

    async def main() -> None:
        session = await provider.create("m", "", RecordingContext())
        await turn(session, "hello")

    with pytest.raises(ProviderUnavailableError) as failed:
        run(main())
    # Neither an hour inside the turn nor a retry after 20 s that the server refused.
    assert sleep.delays == [] and len(server.requests) == 1
    assert "asks to wait 3600 s before the next request (Retry-After; HTTP 429" in str(failed.value)
