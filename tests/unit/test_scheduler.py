"""The turn scheduler: one turn per session, turn.start before the provider, turn.complete
(the commit record) only after a full answer, turn.failed otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from substrat import events, scheduler
from substrat.errors import AgentBusyError, ProviderError
from substrat.eventlog import EventLog, read_log
from substrat.scheduler import MAX_ERROR_CHARS, TurnScheduler

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Session:
    """A provider session streaming fixed chunks; ``hook`` runs before the first one."""

    def __init__(self, chunks: list[Any], fail_after: int | None = None) -> None:
        self.chunks = chunks
        self.fail_after = fail_after
        self.hook: Callable[[], None] | None = None
        self.order: list[str] = []

    async def send(self, prompt: str) -> AsyncIterator[Any]:
        if self.hook is not None:
            self.hook()
        for index, chunk in enumerate(self.chunks):
            if self.fail_after is not None and index >= self.fail_after:
                raise RuntimeError("connection reset")
            self.order.append(f"chunk {index}")
            yield chunk

    def last_transcript(self) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": "".join(map(str, self.chunks))}]

    async def suspend(self) -> bytes:
        return b""

    async def stop(self) -> None:
        return None


def entries(log: EventLog) -> list[tuple[str, dict[str, Any]]]:
    return [(e["event"], e["data"]) for e in read_log(log.path).entries]


def test_claims_are_exclusive_per_session() -> None:
    turns = TurnScheduler()
    turns.claim("s1")
    turns.claim("s2")
    assert turns.is_busy("s1") and turns.busy_count == 2
    with pytest.raises(AgentBusyError, match="already running a turn"):
        turns.claim("s1")
    turns.release("s1")
    turns.release("s1")  # releasing twice is harmless
    assert not turns.is_busy("s1") and turns.busy_count == 1


def test_turn_start_is_durable_before_the_provider_runs(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    session = Session(["Hel", "lo"])
    seen_at_send: list[list[str]] = []
    session.hook = lambda: seen_at_send.append([e for e, _ in entries(log)])

    def commit(response: str, transcript: list[dict[str, Any]]) -> dict[str, Any]:
        session.order.append("commit")
        assert [e for e, _ in entries(log)] == [events.TURN_START]  # not complete yet
        return {"effects": {"spawns": [], "response_seen": response}}

    chunks: list[str] = []
    outcome = run(
        TurnScheduler().run(log, session, "t1", "hi", commit=commit, on_chunk=chunks.append)
    )
    assert seen_at_send == [[events.TURN_START]]
    assert session.order == ["chunk 0", "chunk 1", "commit"]
    assert chunks == ["Hel", "lo"] and outcome.response == "Hello"
    assert outcome.transcript == [{"role": "assistant", "content": "Hello"}]
    assert outcome.complete_seq == log.last_seq == 2
    assert entries(log) == [
        (events.TURN_START, {"turn_id": "t1", "prompt": "hi"}),
        (
            events.TURN_COMPLETE,
            {
                "turn_id": "t1",
                "prompt": "hi",
                "response": "Hello",
                "transcript": [{"role": "assistant", "content": "Hello"}],
                "effects": {"spawns": [], "response_seen": "Hello"},
            },
        ),
    ]
    log.close()


def test_async_chunk_sinks_are_awaited(tmp_path: Path) -> None:
    got: list[str] = []

    async def sink(text: str) -> None:
        await asyncio.sleep(0)
        got.append(text)

    with EventLog(tmp_path / "events.jsonl") as log:
        run(
            TurnScheduler().run(
                log, Session(["a", "b"]), "t1", "p", commit=lambda r, t: {}, on_chunk=sink
            )
        )
    assert got == ["a", "b"]


def no_commit(response: str, transcript: list[dict[str, Any]]) -> dict[str, Any]:
    raise AssertionError("a failed turn must not reach its commit")


@pytest.mark.parametrize(
    ("session", "message"),
    [
        (Session(["part", "more"], fail_after=0), "RuntimeError: connection reset"),
        (Session(["part", "more"], fail_after=1), "RuntimeError: connection reset"),
        (Session(["text", 42]), "provider streamed int, not text"),
    ],
    ids=["before-output", "mid-stream", "not-text"],
)
def test_a_broken_stream_is_logged_as_failed_never_complete(
    tmp_path: Path, session: Session, message: str
) -> None:
    with EventLog(tmp_path / "events.jsonl") as log:
        with pytest.raises(ProviderError, match=r"failed|not text") as caught:
            run(TurnScheduler().run(log, session, "t7", "p", commit=no_commit))
        assert message in str(caught.value)
        (start, failed) = entries(log)
        assert start[0] == events.TURN_START
        assert failed[0] == events.TURN_FAILED and failed[1]["turn_id"] == "t7"
        assert message in failed[1]["error"]


def test_response_size_and_error_text_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler, "MAX_RESPONSE_CHARS", 10)
    with EventLog(tmp_path / "events.jsonl") as log:
        with pytest.raises(ProviderError, match="response over 10 characters"):
            run(
                TurnScheduler().run(log, Session(["123456", "789012"]), "t1", "p", commit=no_commit)
            )

        class Loud(Session):
            async def send(self, prompt: str) -> AsyncIterator[Any]:
                raise ValueError("x" * (3 * MAX_ERROR_CHARS))
                yield ""  # pragma: no cover - makes this an async generator

        with pytest.raises(ProviderError):
            run(TurnScheduler().run(log, Loud([]), "t2", "p", commit=no_commit))
        failed = [d for e, d in entries(log) if e == events.TURN_FAILED]
        assert len(failed) == 2 and len(failed[1]["error"]) == MAX_ERROR_CHARS


def test_a_raising_chunk_sink_fails_the_turn(tmp_path: Path) -> None:
    def sink(text: str) -> None:
        raise OSError("client went away")

    with EventLog(tmp_path / "events.jsonl") as log:
        with pytest.raises(ProviderError, match="client went away"):
            run(
                TurnScheduler().run(log, Session(["a"]), "t1", "p", commit=no_commit, on_chunk=sink)
            )
        assert [e for e, _ in entries(log)] == [events.TURN_START, events.TURN_FAILED]


def test_provider_errors_pass_through_unwrapped(tmp_path: Path) -> None:
    class Refusing(Session):
        async def send(self, prompt: str) -> AsyncIterator[Any]:
            raise ProviderError("quota exhausted")
            yield ""  # pragma: no cover

    with EventLog(tmp_path / "events.jsonl") as log:
        with pytest.raises(ProviderError) as caught:
            run(TurnScheduler().run(log, Refusing([]), "t1", "p", commit=no_commit))
        assert str(caught.value) == "quota exhausted"


@pytest.mark.parametrize(
    ("message", "logged"),
    [
        (None, "cancelled by the caller"),
        ("daemon stopping", "cancelled by the caller: daemon stopping"),
    ],
)
def test_cancellation_is_logged_and_propagates(
    tmp_path: Path, message: str | None, logged: str
) -> None:
    class Hanging(Session):
        async def send(self, prompt: str) -> AsyncIterator[Any]:
            yield "first"
            await asyncio.sleep(3600)

    async def go(log: EventLog) -> None:
        task = asyncio.create_task(
            TurnScheduler().run(log, Hanging([]), "t1", "p", commit=no_commit)
        )
        await asyncio.sleep(0.01)
        task.cancel(message)
        with pytest.raises(asyncio.CancelledError):
            await task

    with EventLog(tmp_path / "events.jsonl") as log:
        run(go(log))
        (_, failed) = entries(log)
        # not the bare "CancelledError: " it was: that told a reader nothing
        assert failed == (events.TURN_FAILED, {"turn_id": "t1", "error": logged})


def test_a_closed_log_is_not_written_after_a_failure(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    session = Session(["a"], fail_after=0)
    session.hook = log.close  # e.g. the agent was terminated mid-turn
    with pytest.raises(ProviderError, match="connection reset"):
        run(TurnScheduler().run(log, session, "t1", "p", commit=no_commit))
    assert [e for e, _ in entries(log)] == [events.TURN_START]
