"""The directive endpoint's stream pieces set no crash point and no conversation.

The crash fuzzer's OpenAI machine and the OpenAI sweeps stream each answer in pieces
of ``CHUNK_CHARS`` (tests/support/directive_chat.py), not the chat server's default
of 5: the SDK decodes a chunk object per piece, and nothing is written to disk while a
turn streams. So a scenario run on the OpenAI provider has the same I/O boundaries,
sends the same requests and keeps the same conversations at either size.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from oracle.harness import CrashHarness
from oracle.workload import Step
from tests.support import directive_chat
from tests.support.chat_server import ChatServer, Reply, _events
from tests.support.directive_chat import CHUNK_CHARS, directive_responder, openai_registry

STEPS = [Step("create_root", "ada"), Step("spawn", "ada", "bob"), Step("ask", "ada", "bob")]
"""Two tool rounds (a spawn, a message) and their answers."""


def _run(chunk_chars: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str, int]:
    """Boundaries, requests, the kept conversations and the chunks streamed of one run of
    STEPS on the openai provider."""
    monkeypatch.setattr(directive_chat, "CHUNK_CHARS", chunk_chars)
    streamed = [0]

    def counted(body: dict[str, Any]) -> Reply:
        reply = directive_responder(body)
        streamed[0] += len(_events(body, reply))
        return reply

    with ChatServer(counted) as server:
        harness = CrashHarness(registry=lambda: openai_registry(server), provider="openai")
        start = harness.fs.boundaries
        assert harness.run_steps(STEPS) is None
        boundaries = harness.fs.boundaries - start
        with harness.fs:
            kept = [harness.orch.history(agent) for agent in sorted(harness.model.state.agents)]
        harness.close()
        requests = json.dumps([r.body for r in server.requests], sort_keys=True)
    return boundaries, requests, repr(kept), streamed[0]


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    yield _run(5, monkeypatch), _run(CHUNK_CHARS, monkeypatch)


def test_the_stream_pieces_change_no_boundary_request_or_conversation(
    runs: tuple[Any, Any],
) -> None:
    small, large = runs
    assert small[:3] == large[:3]
    assert small[0] > 0 and '"role": "tool"' in small[1]  # tool rounds were streamed
    assert large[3] < small[3]  # fewer chunks for the SDK to decode


def test_answers_still_stream_in_several_pieces() -> None:
    """Most answers still come in more than one piece, so the provider still assembles
    each message (text and tool-call arguments) from its deltas."""
    body = {"messages": [{"role": "user", "content": "@spawn w1 child w1 of a"}]}
    for reply in (
        directive_responder(body),
        directive_responder({"messages": [*body["messages"], {"role": "tool"}]}),
    ):
        pieces = [
            e
            for e in _events(body, reply)
            if e["choices"][0]["delta"].get("content")
            or any(
                (c.get("function") or {}).get("arguments")
                for c in e["choices"][0]["delta"].get("tool_calls") or []
            )
        ]
        assert len(pieces) >= 2, reply
