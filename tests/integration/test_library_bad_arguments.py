"""Bad arguments to the library's calls: a clear error, nothing written, nothing used up.

From an outside review that embedded the library: ``run_turn(None, ...)`` ended
in ``AttributeError: 'NoneType' object has no attribute 'split'``; a prompt or
instructions holding a lone surrogate (bytes decoded with ``surrogateescape``)
in orjson's ``TypeError: str is not valid UTF-8: surrogates not allowed``, after
the turn had taken an id; ``ack_user_messages("id")`` acknowledged nothing and
said nothing; and a provider whose answer held a lone surrogate failed its turn
with the same bare TypeError and no ``turn.failed`` in the log.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from substrat.errors import BadInputError, ProviderError
from substrat.eventlog import read_log
from substrat.orchestrator import Orchestrator
from substrat.providers import AgentContext, ProviderSession, TurnRecord
from substrat.providers.registry import default_registry


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for top in ("agents", "user", "roots")
        for p in sorted((root / top).rglob("*"))
        if p.is_file()
    }


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    root = tmp_path / "root"

    async def main() -> None:
        orch = await Orchestrator.open(root)
        await orch.create_root("lead", "x")
        await orch.run_turn("lead", "@send user one")
        before = _files(root)
        refusals: list[tuple[Any, type[BaseException], str]] = [
            (lambda: orch.run_turn(None, "x"), TypeError, "an agent is named by a string"),  # type: ignore[arg-type]
            (lambda: orch.run_turn(5, "x"), TypeError, "not int 5"),  # type: ignore[arg-type]
            (lambda: orch.terminate(None), TypeError, "not NoneType None"),  # type: ignore[arg-type]
            (
                lambda: orch.run_turn("lead", "bad \udcff bytes"),
                BadInputError,
                "invalid UTF-8 in the prompt: byte 0xff at line 1, column 5; nothing was sent",
            ),
            (
                lambda: orch.run_turn("lead", "ok\nx\ud800"),
                BadInputError,
                "U+D800 at line 2, column 2",
            ),
            (
                lambda: orch.create_root("b", "instr\udcfe"),
                BadInputError,
                "invalid UTF-8 in the instructions: byte 0xfe at line 1, column 6; "
                "nothing was created",
            ),
            (lambda: orch.create_root("c", None), TypeError, "instructions must be a string"),  # type: ignore[arg-type]
        ]
        for call, kind, words in refusals:
            with pytest.raises(kind) as caught:
                await call()
            assert words in str(caught.value), str(caught.value)
        for sync, words in [
            (lambda: orch.get(None), "an agent is named by a string"),  # type: ignore[arg-type]
            (lambda: orch.lookup(["lead"]), "not list"),  # type: ignore[arg-type]
            (lambda: orch.history(3.5), "not float"),  # type: ignore[arg-type]
        ]:
            with pytest.raises(TypeError, match=words):
                sync()
        message_id = orch.user_inbox()[0].message_id
        for bad in (message_id, None, [None], (m for m in [message_id])):
            with pytest.raises(TypeError, match="message_ids must be a list of message id"):
                orch.ack_user_messages(bad)  # type: ignore[arg-type]
        assert _files(root) == before  # nothing written: no turn.start, no record, no ack
        assert [a.name for a in orch.agents()] == ["lead"]
        # no turn id was used up by a refused prompt
        assert (await orch.run_turn("lead", "fine")).turn_id == "t2"
        assert orch.ack_user_messages((message_id,)) == [message_id]
        await orch.close()

    asyncio.run(main())


class _Session:
    def __init__(self) -> None:
        self._last: list[dict[str, Any]] = []

    async def send(self, prompt: str) -> AsyncIterator[str]:
        answer = "half \ud83d of an emoji" if prompt == "surrogate" else "fine"
        self._last = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        yield answer

    def last_transcript(self) -> list[dict[str, Any]]:
        return self._last

    async def suspend(self) -> bytes:
        return b""

    async def stop(self) -> None:
        pass


class _Provider:
    name = "halves"
    default_model = "halves-1"

    def models(self) -> list[str]:
        return ["halves-1"]

    async def create(
        self, model: str, system_prompt: str, context: AgentContext
    ) -> ProviderSession:
        return _Session()

    async def restore(
        self,
        blob: bytes,
        history: list[TurnRecord],
        *,
        model: str,
        system_prompt: str,
        context: AgentContext,
    ) -> ProviderSession:
        return _Session()


def test_an_answer_holding_a_lone_surrogate_fails_its_turn_in_words(tmp_path: Path) -> None:
    root = tmp_path / "root"
    registry = default_registry()
    registry.register("halves", _Provider)

    async def main() -> None:
        orch = await Orchestrator.open(root, registry=registry)
        info = await orch.create_root("a", "x", provider="halves")
        with pytest.raises(ProviderError) as caught:
            await orch.run_turn("a", "surrogate")
        words = str(caught.value)
        assert words.startswith("turn t1 cannot be kept: its answer, transcript or effects")
        assert "surrogates not allowed" in words and "nothing of it was kept" in words
        assert (await orch.run_turn("a", "again")).turn_id == "t2"
        await orch.close()
        log = root / "agents" / info.session_id / "events.jsonl"
        entries = [(e["event"], e["data"].get("turn_id")) for e in read_log(log).entries]
        assert ("turn.failed", "t1") in entries
        assert ("turn.complete", "t1") not in entries
        failed = next(e for e in read_log(log).entries if e["event"] == "turn.failed")
        json.dumps(failed)  # plain JSON: the error is logged in words, not the surrogate
        again = await Orchestrator.open(root, registry=registry)
        assert [t.turn_id for t in again.history("a")] == ["t2"]
        assert again.recovery_report is not None
        assert again.recovery_report.to_dict()["lost_turns"] == []
        await again.close()

    asyncio.run(main())
