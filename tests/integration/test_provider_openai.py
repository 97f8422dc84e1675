"""The openai provider against a real chat-completions server on loopback: streaming,
tool rounds, recovery from the log and the blob."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from substrat import events
from substrat.errors import (
    ProviderError,
    ProviderRejectedError,
)
from substrat.providers.base import TurnRecord
from substrat.providers.chat_history import ORPHAN_RESULT_TEXT
from substrat.providers.openai_chat import OpenAISession
from tests.support.chat_server import (
    ChatServer,
    conversation_problem,
    error,
    text,
    tool_call,
    tools,
)
from tests.support.context import RecordingContext, SimulatedCrash
from tests.support.openai_provider import SYSTEM, TurnLog, make_provider, run, turn


@pytest.fixture
def server() -> Iterator[ChatServer]:
    with ChatServer() as running:
        yield running


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
