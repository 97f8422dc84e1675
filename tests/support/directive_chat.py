"""A chat-completions endpoint that acts on scripted-provider directives.

For crash fuzzing the ``openai`` provider with the same workloads as the
scripted one: when the last message is the user's, its ``@spawn``/``@send``/
... lines become real tool calls (a tool-call round); when the last messages
are tool results, the model answers with text. Deterministic for a given
conversation.
"""

from __future__ import annotations

from typing import Any

from substrat.providers.openai_chat import OpenAIProvider
from substrat.providers.openai_config import OpenAIConfig
from substrat.providers.registry import ProviderRegistry
from substrat.providers.scripted import parse_directives
from tests.support.chat_server import ChatServer, Reply, text, tool_call, tools

PIECES = 2
"""Streamed pieces of an answer's text and of each tool call's arguments (halves).

Nothing is written to disk while a turn streams, so the pieces set neither the crash
points nor the conversations (both are the same at any size), only how many chunks the
SDK decodes: at the chat server's default of 5 characters a piece, a model-validated
chunk object per piece was about a fifth of an OpenAI crash-fuzzer example's CPU. In
halves every answer of two characters or more still comes in two pieces, so the
provider's assembly of a message from its deltas is still what the recovered
conversations are compared through (at 16 characters a piece, session 28, answers
shorter than that came whole); the tests of the provider itself stream in pieces of 3-5
characters. On 20 seeded examples halves send 1,645 chunks where 16 characters sent
1,878 (docs/benchmarks.md, "The OpenAI crash items beside the scripted ones")."""


def directive_responder(body: dict[str, Any]) -> Reply:
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        answered = 0
        for message in reversed(messages):
            if message.get("role") != "tool":
                break
            answered += 1
        reply = text(f"done after {answered} tool results ({len(messages)} messages)")
    elif calls := parse_directives(str(last.get("content") or "")):
        reply = tools(*(tool_call(name, args) for name, args in calls))
    else:
        reply = text(f"noted ({len(messages)} messages)")
    reply.pieces = PIECES
    return reply


def openai_registry(server: ChatServer) -> ProviderRegistry:
    """A registry whose ``openai`` provider talks to ``server``."""
    registry = ProviderRegistry()
    config = OpenAIConfig(
        base_url=server.base_url, api_key="test", request_timeout_s=10.0, max_retries=0
    )
    registry.register("openai", OpenAIProvider(config, http_client=plain_http_client))
    return registry


def plain_http_client() -> Any:
    """The SDK's HTTP client without a TLS trust store, for the loopback server's plain
    ``http://``: the default one loads the CA bundle for every event loop (a crash
    fuzzer example runs several), which was about a sixth of an OpenAI example's CPU."""
    import openai

    return openai.DefaultAsyncHttpxClient(verify=False, trust_env=False)
