"""The turn scheduler: one turn at a time per session, logged around the provider call.

``turn.start`` is durable before the provider is called. ``turn.complete``
(the commit record, carrying the turn's staged effects) is written only after
the provider answered in full. A provider that raises, or a stream cut
halfway, is logged as ``turn.failed`` and never as complete.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from substrat import events
from substrat.errors import AgentBusyError, EntryTooLargeError, ProviderError
from substrat.providers.base import ProviderSession

MAX_RESPONSE_CHARS = 4 * 1024 * 1024
MAX_ERROR_CHARS = 2000

ChunkSink = Callable[[str], Awaitable[None] | None]


class TurnLog(Protocol):
    """Where a turn is logged: an ``EventLog``, or anything that finds the agent's."""

    @property
    def closed(self) -> bool: ...

    def log(self, event: str, data: Mapping[str, Any] | None = None) -> int: ...


@dataclass
class TurnOutcome:
    response: str
    transcript: list[dict[str, Any]]
    complete_seq: int


class TurnScheduler:
    """Runs turns; the lock per session makes a second concurrent turn fail fast."""

    def __init__(self) -> None:
        self._busy: set[str] = set()
        self._idle: dict[str, asyncio.Event] = {}

    def is_busy(self, session_id: str) -> bool:
        return session_id in self._busy

    @property
    def busy_count(self) -> int:
        return len(self._busy)

    def claim(self, session_id: str) -> None:
        if session_id in self._busy:
            raise AgentBusyError(f"session {session_id} is already running a turn")
        self._busy.add(session_id)

    def release(self, session_id: str) -> None:
        self._busy.discard(session_id)
        idle = self._idle.pop(session_id, None)
        if idle is not None:
            idle.set()

    async def wait_idle(self, session_id: str) -> None:
        """Return once the session's running turn (if any) has released it."""
        if session_id in self._busy:
            await self._idle.setdefault(session_id, asyncio.Event()).wait()

    async def run(
        self,
        log: TurnLog,
        session: ProviderSession,
        turn_id: str,
        prompt: str,
        *,
        commit: Callable[[str, list[dict[str, Any]]], dict[str, Any]],
        on_chunk: ChunkSink | None = None,
    ) -> TurnOutcome:
        """Run one turn on a claimed session.

        ``commit(response, transcript)`` returns the extra fields of the
        ``turn.complete`` entry (the staged effects); it runs after the
        provider answered and before the entry is written.
        """
        log.log(events.TURN_START, {"turn_id": turn_id, "prompt": prompt})
        chunks: list[str] = []
        size = 0
        try:
            async for chunk in session.send(prompt):
                if not isinstance(chunk, str):
                    raise ProviderError(f"provider streamed {type(chunk).__name__}, not text")
                size += len(chunk)
                if size > MAX_RESPONSE_CHARS:
                    raise ProviderError(f"response over {MAX_RESPONSE_CHARS} characters")
                chunks.append(chunk)
                if on_chunk is not None:
                    maybe = on_chunk(chunk)
                    if maybe is not None:
                        await maybe
            transcript = session.last_transcript()
        except (Exception, asyncio.CancelledError) as exc:
            reason = failure_reason(exc)
            if not log.closed:
                log.log(events.TURN_FAILED, {"turn_id": turn_id, "error": reason})
            if isinstance(exc, ProviderError | asyncio.CancelledError):
                raise
            raise ProviderError(f"turn {turn_id} failed: {reason}") from exc
        response = "".join(chunks)
        # the prompt again: a damaged turn.start must not cost a committed turn its prompt
        data = {
            "turn_id": turn_id,
            "prompt": prompt,
            "response": response,
            "transcript": transcript,
        }
        data.update(commit(response, transcript))
        try:
            seq = log.log(events.TURN_COMPLETE, data)
        except EntryTooLargeError as exc:  # refused before a byte was written
            reason = (
                f"turn {turn_id} is too large to keep: its answer, transcript and effects are "
                f"over the log's limit for one entry ({exc}); nothing of it was kept, ask for "
                "a shorter answer or for it in parts"
            )
            # without it, a restart reported the turn lost in a crash, and told the agent so
            log.log(events.TURN_FAILED, {"turn_id": turn_id, "error": reason[:MAX_ERROR_CHARS]})
            raise ProviderError(reason) from exc
        except TypeError as exc:  # not plain JSON (a lone surrogate in the answer, an object)
            reason = (
                f"turn {turn_id} cannot be kept: its answer, transcript or effects are not "
                f"plain JSON text ({exc}); nothing of it was kept (a provider that decodes "
                "bytes must hand substrat valid Unicode, e.g. decode with errors='replace')"
            )
            log.log(events.TURN_FAILED, {"turn_id": turn_id, "error": reason[:MAX_ERROR_CHARS]})
            raise ProviderError(reason) from exc
        return TurnOutcome(response, transcript, seq)


def failure_reason(exc: BaseException) -> str:
    """The ``error`` of a ``turn.failed`` (or a refused blob) entry: one line, bounded.

    A cancelled turn says so: ``CancelledError`` carries no message, and the bare
    ``"CancelledError: "`` told a reader nothing.
    """
    if isinstance(exc, asyncio.CancelledError):
        reason = "cancelled by the caller" + (f": {exc}" if str(exc) else "")
    else:
        reason = f"{type(exc).__name__}: {exc}"
    return reason[:MAX_ERROR_CHARS]
