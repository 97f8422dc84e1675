"""The provider's request is the one the SDK's ``chat.completions.create`` would send.

The provider posts its streamed request through the SDK's ``post`` and skips
``create``'s walk of the body against the SDK's parameter types (see
``OpenAIProvider.open_stream``). That is only sound while the walk changes
nothing in the bodies we send, so here every request of a conversation with
every shape of message (system, user, assistant text, assistant tool calls,
tool results, the tool-round limit's ``tool_choice``, text beyond ASCII) is
sent again through ``create`` to the same loopback server, and both must
arrive as the same JSON value (key order aside), at the same path, with the
same key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from substrat.providers.openai_chat import OpenAIConfig, OpenAIProvider
from tests.support.chat_server import ChatServer, Recorded, text, tool_call, tools
from tests.support.context import RecordingContext, RecordingSleep

pytest.importorskip("openai", reason="the openai SDK is an extra: pip install 'substrat[openai]'")


@pytest.fixture
def server() -> Iterator[ChatServer]:
    with ChatServer() as running:
        yield running


def conversation(server: ChatServer) -> list[Recorded]:
    """Three turns through the provider; the requests the server saw."""
    provider = OpenAIProvider(
        OpenAIConfig(base_url=server.base_url, api_key="key-1", max_tool_rounds_per_turn=2),
        sleep=RecordingSleep(),
    )
    server.script(
        tools(tool_call("add", {"a": 2, "b": 3}, "call_A"), tool_call("echo", {"text": "héllo ✓"})),
        text("Five, and you said héllo ✓."),
        tools(tool_call("echo", {"text": "again"})),
        tools(tool_call("echo", {"text": "and again"})),
        text("stopping here"),
        text("plain answer"),
    )

    async def main() -> None:
        session = await provider.create("model-x", "Be brief. Ünïcode is fine.", RecordingContext())
        try:
            for prompt in ("add 2 and 3, then echo", "loop on echo", "just say something"):
                async for _ in session.send(prompt):
                    pass
        finally:
            await session.stop()

    asyncio.run(main())
    assert not server.rejected()
    return list(server.requests)


def resend_through_create(server: ChatServer, body: dict[str, Any]) -> Recorded:
    import openai

    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="key-1", max_retries=0)
        try:
            fields = {key: value for key, value in body.items() if key != "stream"}
            stream = await client.chat.completions.create(**fields, stream=True)
            async for _ in stream:
                pass
        finally:
            await client.close()

    server.script(text("again"))
    asyncio.run(main())
    return server.requests[-1]


def test_every_request_is_what_create_would_have_sent(server: ChatServer) -> None:
    sent = conversation(server)
    shapes = {m["role"] for request in sent for m in request.messages}
    assert shapes == {"system", "user", "assistant", "tool"}
    assert any(request.body.get("tool_choice") == "none" for request in sent)
    assert any("tool_calls" in m for request in sent for m in request.messages)
    for request in sent:
        again = resend_through_create(server, request.body)
        assert again.body == request.body
        assert (again.path, again.authorization) == (request.path, request.authorization)
        assert request.authorization == "Bearer key-1"
        assert request.body["stream"] is True
