"""The scripted provider (directives, digests, blobs) and the fake one (failures on demand)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from substrat.errors import ProviderError
from substrat.providers.base import AgentContext, Provider, ProviderSession, TurnRecord
from substrat.providers.fake import FakeProvider
from substrat.providers.scripted import (
    CHUNK_CHARS,
    MAX_DIRECTIVES_PER_TURN,
    ScriptedProvider,
    chain_digest,
    decode_blob,
    parse_directives,
    reply_header,
)
from tests.support.context import RecordingContext

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def turn(session: ProviderSession, prompt: str) -> tuple[str, list[str]]:
    chunks = [chunk async for chunk in session.send(prompt)]
    return "".join(chunks), chunks


def test_directives_map_to_tool_calls() -> None:
    prompt = "\n".join(
        [
            "plain talk is ignored",
            "@spawn worker be careful out there",
            "@spawn bare",
            "@send boss/worker line one\\nline two",
            "@ask worker what now?",
            "@broadcast hello all",
            "@inbox",
            "@children",
            "@inspect worker",
            "@complete done\\n@send user sneaky",
            "@terminate worker",
            "@unknown directive",
            " @spawn indented-is-not-a-directive",
            "@send",
        ]
    )
    assert parse_directives(prompt) == [
        ("spawn_agent", {"name": "worker", "instructions": "be careful out there"}),
        ("spawn_agent", {"name": "bare"}),
        ("send_message", {"recipient": "boss/worker", "text": "line one\nline two"}),
        ("send_message", {"recipient": "worker", "text": "what now?", "expect_reply": True}),
        ("broadcast", {"text": "hello all"}),
        ("check_inbox", {}),
        ("list_children", {}),
        ("inspect_agent", {"name": "worker"}),
        ("complete", {"result": "done\n@send user sneaky"}),
        ("terminate", {"name": "worker"}),
        ("send_message", {}),
    ]


def test_directives_per_turn_are_bounded() -> None:
    calls = parse_directives("\n".join(["@inbox"] * (MAX_DIRECTIVES_PER_TURN + 5)))
    assert len(calls) == MAX_DIRECTIVES_PER_TURN


def test_a_turn_calls_tools_in_order_and_names_its_digest() -> None:
    async def go() -> None:
        ctx = RecordingContext()
        session = await ScriptedProvider().create("directives", "", ctx)
        first, chunks = await turn(session, "@spawn a\n@send a hello")
        assert ctx.calls == [
            ("spawn_agent", {"name": "a"}, "t1c0"),
            ("send_message", {"recipient": "a", "text": "hello"}, "t1c1"),
        ]
        digest = chain_digest("", "@spawn a\n@send a hello")
        assert first.splitlines() == [
            f"#1 scripted reply; digest of the conversation so far: {digest}",
            "spawn_agent: error: unknown tool 'spawn_agent'",
            "send_message: error: unknown tool 'send_message'",
        ]
        assert all(len(c) <= CHUNK_CHARS for c in chunks) and len(chunks) > 1
        assert session.last_transcript() == [
            {"role": "user", "content": "@spawn a\n@send a hello"},
            {"role": "assistant", "content": first},
        ]
        second, _ = await turn(session, "again")
        assert second == reply_header(2, chain_digest(digest, "again"))
        assert ctx.calls[-1][2] == "t1c1"  # no directives, no calls

    run(go())


def test_restore_from_blob_or_history_continues_identically() -> None:
    async def go() -> None:
        provider = ScriptedProvider()
        original = await provider.create("directives", "", RecordingContext())
        for prompt in ("one", "two"):
            await turn(original, prompt)
        blob = await original.suspend()
        turns = decode_blob(blob)
        assert [(t.turn_id, t.prompt) for t in turns] == [("t1", "one"), ("t2", "two")]
        from_blob = await provider.restore(
            blob, [], model="directives", system_prompt="", context=RecordingContext()
        )
        from_log = await provider.restore(
            b"", turns, model="directives", system_prompt="", context=RecordingContext()
        )
        stale = await provider.restore(
            b"", turns[:1], model="directives", system_prompt="", context=RecordingContext()
        )
        expected, _ = await turn(original, "three")
        assert (await turn(from_blob, "three"))[0] == expected
        assert (await turn(from_log, "three"))[0] == expected
        assert (await turn(stale, "three"))[0] != expected  # a lost turn shows

    run(go())


@pytest.mark.parametrize(
    "blob",
    [b"not json", b"[]", json.dumps({"version": 99, "turns": []}).encode(), b"\xff\xfe"],
)
def test_unreadable_blobs_are_refused(blob: bytes) -> None:
    with pytest.raises((ValueError, UnicodeDecodeError)):
        decode_blob(blob)
    with pytest.raises(ProviderError, match="unreadable"):
        run(
            ScriptedProvider().restore(
                blob, [], model="directives", system_prompt="", context=RecordingContext()
            )
        )


def test_a_script_replaces_the_directives() -> None:
    seen: list[tuple[str, int]] = []

    def sync_script(prompt: str, turns: list[TurnRecord], ctx: AgentContext) -> str:
        seen.append((prompt, len(turns)))
        return f"echo {prompt}"

    async def async_script(prompt: str, turns: list[TurnRecord], ctx: AgentContext) -> str:
        return await ctx.call_tool("add", {"a": 2, "b": len(turns)}, "x")

    async def go() -> None:
        session = await ScriptedProvider(sync_script).create("m", "", RecordingContext())
        await turn(session, "@spawn ignored")
        response, _ = await turn(session, "second")
        assert response.endswith("\necho second") and seen == [("@spawn ignored", 0), ("second", 1)]
        session = await ScriptedProvider(async_script).create("m", "", RecordingContext())
        await turn(session, "a")
        response, _ = await turn(session, "b")
        assert response.endswith("\n3")

    run(go())


def test_providers_satisfy_the_protocol() -> None:
    assert isinstance(ScriptedProvider(), Provider) and isinstance(FakeProvider(), Provider)
    assert ScriptedProvider().models() == ["directives"] and FakeProvider().models() == ["fake"]


def test_fake_provider_fails_on_demand_and_records_calls() -> None:
    async def go() -> None:
        fake = FakeProvider()
        fake.fail_create = 1
        with pytest.raises(ProviderError, match="create failed"):
            await fake.create("fake", "", RecordingContext())
        session = await fake.create("fake", "", RecordingContext())
        fake.fail_send = 1
        with pytest.raises(ProviderError, match="send failed"):
            await turn(session, "x")
        fake.cut_after_chunks = 1
        got: list[str] = []
        with pytest.raises(ProviderError, match="cut after 1 chunks"):
            async for chunk in session.send("@inbox\n" * 4):
                got.append(chunk)
        assert len(got) == 1
        ok, _ = await turn(session, "fine")
        assert ok.startswith("#1 ")  # neither failure counted as a turn
        fake.fail_suspend = 1
        with pytest.raises(ProviderError, match="suspend failed"):
            await session.suspend()
        blob = await session.suspend()
        fake.fail_restore = 1
        with pytest.raises(ProviderError, match="restore failed"):
            await fake.restore(blob, [], model="fake", system_prompt="", context=RecordingContext())
        again = await fake.restore(
            blob, [], model="fake", system_prompt="", context=RecordingContext()
        )
        assert (await turn(again, "more"))[0].startswith("#2 ")
        await again.stop()
        assert [c[0] for c in fake.calls] == [
            "create",
            "create",
            "send",
            "send",
            "send",
            "suspend",
            "suspend",
            "restore",
            "restore",
            "send",
            "stop",
        ]
        assert fake.fail_send == fake.fail_create == fake.fail_restore == 0

    run(go())


def test_a_model_the_in_process_providers_do_not_have_is_refused_at_creation_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--model gpt-4o`` on the scripted provider was taken and shown, and did nothing.
    Now creating such an agent is refused; an agent made with one before (the check
    skipped here, as by an older version) still restores and runs."""
    from substrat.orchestrator import Orchestrator

    root = tmp_path / "root"

    async def create(model: str | None, provider: str = "scripted") -> str:
        orch = await Orchestrator.open(root)
        try:
            return (
                await orch.create_root(f"a{len(orch.agents())}", provider=provider, model=model)
            ).model
        finally:
            await orch.close()

    assert run(create(None)) == "directives"
    assert run(create("directives")) == "directives"
    for provider, model in (("scripted", "gpt-4o"), ("fake", "directives")):
        with pytest.raises(ValueError, match=f"the {provider} provider has one model"):
            run(create(model, provider))
    monkeypatch.delattr(ScriptedProvider, "check_model")
    assert run(create("gpt-4o")) == "gpt-4o"
    monkeypatch.undo()

    async def turn_of_the_old_one() -> str:
        orch = await Orchestrator.open(root)
        try:
            return (await orch.run_turn("a2", "still there?")).response
        finally:
            await orch.close()

    assert run(turn_of_the_old_one()).startswith("#1 scripted reply")
