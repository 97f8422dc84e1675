"""Evict, restore, more turns, crash: the recovered conversation holds every turn.

The blob saved at the eviction is older than the log by the time of the
crash; recovery must notice and rebuild the provider's conversation from the
log. The scripted provider's responses chain a digest of every prompt it has
seen, so a session resumed from the stale blob would answer with a wrong
digest at the next turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from substrat import events
from substrat.eventlog import read_log
from substrat.orchestrator import Orchestrator
from substrat.providers.scripted import chain_digest, decode_blob, reply_digest, reply_header
from substrat.session import SessionState, SessionStore
from tests.support.kill import abandon

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def digests(prompts: list[str]) -> list[str]:
    out, digest = [], ""
    for prompt in prompts:
        digest = chain_digest(digest, prompt)
        out.append(digest)
    return out


def restored_sources(orch: Orchestrator, agent: str) -> list[str]:
    path = orch.logs.path(orch.get(agent).session_id)
    return [
        e["data"]["source"] for e in read_log(path).entries if e["event"] == events.SESSION_RESTORED
    ]


@pytest.mark.parametrize("turns_after_restore", [0, 1, 3])
def test_history_survives_evict_restore_turns_crash(root: Path, turns_after_restore: int) -> None:
    prompts = [f"prompt {i}" for i in range(1, 3 + turns_after_restore)]

    async def before_crash() -> str:
        orch = await Orchestrator.open(root, slots=1)
        alpha = await orch.create_root("alpha")
        for prompt in prompts[:2]:
            await orch.run_turn("alpha", prompt)
        await orch.create_root("beta")  # one slot: alpha is evicted
        await orch.run_turn("beta", "beta's turn")
        blob = SessionStore(root).load(alpha.session_id).provider_state
        assert [t.prompt for t in decode_blob(blob)] == prompts[:2]
        for prompt in prompts[2:]:  # alpha is restored from its blob and goes on
            await orch.run_turn("alpha", prompt)
        assert restored_sources(orch, "alpha") == (["blob"] if turns_after_restore else [])
        abandon(orch)
        return alpha.agent_id

    alpha_id = run(before_crash())

    async def after_crash() -> None:
        orch = await Orchestrator.open(root, slots=1)
        record = SessionStore(root).load(orch.get(alpha_id).session_id)
        assert record.state is SessionState.SUSPENDED  # ACTIVE at the crash, if restored
        assert [t.prompt for t in orch.history(alpha_id)] == prompts
        assert [reply_digest(t.response) for t in orch.history(alpha_id)] == digests(prompts)
        result = await orch.run_turn(alpha_id, "after the crash")
        expected = digests([*prompts, "after the crash"])[-1]
        assert result.response.startswith(reply_header(len(prompts) + 1, expected))
        # a stale blob is never trusted: with turns after the restore, the log rebuilds it
        source = restored_sources(orch, alpha_id)[-1]
        assert source == ("log" if turns_after_restore else "blob")
        beta = orch.history("beta")
        assert [t.prompt for t in beta] == ["beta's turn"]
        await orch.close()

    run(after_crash())


def test_children_conversations_survive_eviction_and_a_crash(root: Path) -> None:
    async def before_crash() -> dict[str, list[str]]:
        orch = await Orchestrator.open(root, slots=1)
        await orch.create_root("lead")
        await orch.run_turn("lead", "@spawn a\n@spawn b")
        for n in range(3):
            await orch.run_turn("lead", f"@send a round {n}\n@send b round {n}")
            assert await orch.run_pending() == 2
        prompts = {i.path: [t.prompt for t in orch.history(i.agent_id)] for i in orch.agents()}
        abandon(orch)
        return prompts

    prompts = run(before_crash())

    async def after_crash() -> None:
        orch = await Orchestrator.open(root, slots=1)
        assert {i.path: [t.prompt for t in orch.history(i.agent_id)] for i in orch.agents()} == (
            prompts
        )
        await orch.run_turn("lead", "@send a last\n@send b last")
        assert await orch.run_pending() == 2
        for info in orch.agents():
            history = orch.history(info.agent_id)
            assert [reply_digest(t.response) for t in history] == digests(
                [t.prompt for t in history]
            )
        await orch.close()

    run(after_crash())
