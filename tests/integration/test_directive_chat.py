"""The directive endpoint's stream pieces set no crash point and no conversation.

The crash fuzzer's OpenAI machine and the OpenAI sweeps stream the text and each
call's arguments of an answer in ``PIECES`` pieces (halves; tests/support/directive_chat.py),
not in the chat server's default of 5 characters a piece: the SDK decodes a chunk object
per piece, and nothing is written to disk while a turn streams. So a scenario run on the
OpenAI provider has the same I/O boundaries, sends the same requests and keeps the same
conversations either way.
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
from tests.support.directive_chat import PIECES, directive_responder, openai_registry

STEPS = [Step("create_root", "ada"), Step("spawn", "ada", "bob"), Step("ask", "ada", "bob")]
"""Two tool rounds (a spawn, a message) and their answers."""


def _run(pieces: int | None, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str, int]:
    """Boundaries, requests, the kept conversations and the chunks streamed of one run of
    STEPS on the openai provider (``pieces`` None: 5 characters a piece)."""
    monkeypatch.setattr(directive_chat, "PIECES", pieces)
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
    yield _run(None, monkeypatch), _run(PIECES, monkeypatch)


def test_the_stream_pieces_change_no_boundary_request_or_conversation(
    runs: tuple[Any, Any],
) -> None:
    small, large = runs
    assert small[:3] == large[:3]
    assert small[0] > 0 and '"role": "tool"' in small[1]  # tool rounds were streamed
    assert large[3] < small[3]  # fewer chunks for the SDK to decode


def _pieces(body: dict[str, Any], reply: Reply) -> list[int]:
    """How many pieces the text (if any) and each call's arguments of ``reply`` stream in."""
    text_pieces = 0
    arguments: dict[int, int] = {}
    for event in _events(body, reply):
        delta = event["choices"][0]["delta"]
        text_pieces += bool(delta.get("content"))
        for call in delta.get("tool_calls") or []:
            if (call.get("function") or {}).get("arguments"):
                arguments[call["index"]] = arguments.get(call["index"], 0) + 1
    return ([text_pieces] if reply.text else []) + list(arguments.values())


def test_every_answer_streams_in_two_pieces() -> None:
    """The text and each tool call's arguments of every answer come in two pieces, however
    short, so the provider assembles each message (text and arguments) from its deltas."""
    user = {"role": "user", "content": "@spawn w1 child w1 of a\n@send w1 hi"}
    bodies = [
        {"messages": [user]},  # two tool calls
        {"messages": [{"role": "user", "content": "@send b x"}]},  # short arguments
        {"messages": [user, {"role": "tool"}]},  # the answer after the tool results
        {"messages": [{"role": "user", "content": "hi"}]},  # a plain answer
    ]
    replies = [directive_responder(body) for body in bodies]
    assert [len(reply.tool_calls) for reply in replies] == [2, 1, 0, 0]
    for body, reply in zip(bodies, replies, strict=True):
        assert _pieces(body, reply) == [2] * (bool(reply.text) + len(reply.tool_calls)), reply
