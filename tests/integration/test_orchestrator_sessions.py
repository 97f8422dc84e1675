"""The orchestrator's public API on real files: eviction and restored sessions, clean
restarts, bounds, and operations that race each other."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from substrat import events
from substrat.agents import USER, AgentState
from substrat.errors import (
    AgentError,
    NameCollisionError,
    ProviderError,
)
from substrat.orchestrator import Orchestrator
from substrat.providers.base import AgentContext
from substrat.providers.fake import FakeProvider
from substrat.providers.scripted import ScriptedProvider
from substrat.session import SessionState, SessionStore
from tests.support.orch_api import Gate, log_events, registry, run, slow_suspend_provider

# -- eviction and restarts -----------------------------------------------------------------


def test_evict_saves_a_blob_and_the_next_turn_restores_it(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        info = await orch.create_root("alpha")
        await orch.run_turn("alpha", "one")
        assert await orch.evict("alpha") is True
        assert await orch.evict("alpha") is False
        record = SessionStore(root).load(info.session_id)
        assert record.state is SessionState.SUSPENDED and record.provider_state
        second = await orch.run_turn("alpha", "two")
        assert second.response.startswith("#2 ")
        restored = [d for e, d in log_events(orch, "alpha") if e == events.SESSION_RESTORED]
        assert restored == [{"provider": "scripted", "model": "directives", "source": "blob"}]
        suspended = [d for e, d in log_events(orch, "alpha") if e == events.SUSPEND_RESULT]
        assert suspended == [{"state_size": len(record.provider_state)}]
        await orch.close()

    run(go())


def test_unreadable_blob_falls_back_to_the_log(root: Path) -> None:
    fake = FakeProvider()

    async def go() -> None:
        orch = await Orchestrator.open(root, registry=registry(fake=fake))
        info = await orch.create_root("alpha", provider="fake")
        reference = await orch.run_turn("alpha", "one")
        await orch.evict("alpha")
        fake.fail_restore = 1
        fake.calls.clear()
        second = await orch.run_turn("alpha", "two")
        assert second.response.startswith("#2 ")
        assert [c for c in fake.calls if c[0] == "restore"] == [
            ("restore", "blob"),
            ("restore", "history"),
        ]
        restored = [d for e, d in log_events(orch, "alpha") if e == events.SESSION_RESTORED]
        # the log says why the blob was not used, in the provider's words
        assert restored[-1]["source"] == "log"
        assert restored[-1]["blob_refused"] == "ProviderError: fake provider: restore failed"
        assert all("blob_refused" not in d for d in restored[:-1])
        assert orch.history(info.agent_id)[0].response == reference.response
        await orch.close()

    run(go())


def test_suspend_failure_is_logged_and_the_log_restores_the_session(root: Path) -> None:
    fake = FakeProvider()

    async def go() -> None:
        orch = await Orchestrator.open(root, registry=registry(fake=fake))
        await orch.create_root("alpha", provider="fake")
        await orch.run_turn("alpha", "one")
        fake.fail_suspend = 1
        assert await orch.evict("alpha") is True
        suspended = [d for e, d in log_events(orch, "alpha") if e == events.SUSPEND_RESULT]
        assert suspended[-1]["state_size"] == 0 and "suspend failed" in suspended[-1]["error"]
        assert (await orch.run_turn("alpha", "two")).response.startswith("#2 ")
        await orch.close()

    run(go())


def test_clean_close_and_reopen_keeps_everything(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root, slots=2)
        await orch.create_root("boss")
        await orch.run_turn("boss", "@spawn a\n@spawn b\n@ask a sum\n@send b note")
        await orch.run_turn("boss", "@complete status")
        before = [(i.to_dict(), orch.history(i.agent_id)) for i in orch.agents()]
        inboxes = {i.path: orch.inspect(i.path)["inbox"] for i in orch.agents()}
        user = orch.user_inbox()
        tree = orch.tree_view()
        await orch.close()

        orch = await Orchestrator.open(root, slots=2)
        report = orch.recovery_report
        assert report is not None
        assert (report.agents, report.roots, report.lost_turns, report.reconciled) == (3, 1, [], [])
        assert [(i.to_dict(), orch.history(i.agent_id)) for i in orch.agents()] == before
        assert {i.path: orch.inspect(i.path)["inbox"] for i in orch.agents()} == inboxes
        assert orch.user_inbox() == user
        assert orch.tree_view() == tree
        assert [c["agent"]["path"] for c in tree[0]["children"]] == ["boss/a", "boss/b"]
        states = {s.state for s in SessionStore(root).scan(quarantine=False).sessions}
        assert SessionState.ACTIVE not in states
        # the boss still waits for a's reply, and gets it
        assert orch.get("boss").state is AgentState.WAITING
        assert await orch.run_pending() == 3
        assert orch.get("boss").state is AgentState.IDLE
        await orch.close()

    run(go())


def test_run_pending_bounds(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        with pytest.raises(ValueError, match="max_turns"):
            await orch.run_pending(max_turns=-1)
        await orch.create_root("boss")
        await orch.run_turn("boss", "@spawn a\n@spawn b\n@broadcast nobody yet")
        assert await orch.run_pending() == 0  # children staged in the same turn miss it
        await orch.run_turn("boss", "@broadcast go")
        assert await orch.run_pending(max_turns=0) == 0
        assert await orch.run_pending(max_turns=1) == 1
        assert await orch.run_pending() == 1
        assert await orch.run_pending() == 0
        await orch.close()

    run(go())


def test_terminated_agents_leave_no_per_agent_state_behind(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        await orch.create_root("boss")
        for round_ in range(3):
            await orch.run_turn("boss", "@spawn a\n@spawn b")
            await orch.run_turn("boss", f"@send a round {round_}\n@send b round {round_}")
            assert await orch.run_pending() == 2
            await orch.run_turn("boss", "@terminate a\n@terminate b")
        boss = orch.get("boss").agent_id
        assert set(orch.turn_counts) == set(orch.last_complete_seq) == {boss}
        assert set(orch.sessions) == {orch.get("boss").session_id}
        assert set(orch.inboxes.endpoints()) <= {boss, USER}
        assert not orch.mux.is_live(boss) or orch.mux.live_count() == 1
        await orch.close()

    run(go())


def test_turn_ids_stay_unique_when_a_session_cannot_be_restored(root: Path) -> None:
    fake = FakeProvider()

    async def go() -> None:
        orch = await Orchestrator.open(root, registry=registry(fake=fake))
        await orch.create_root("alpha", provider="fake")
        await orch.run_turn("alpha", "one")
        await orch.evict("alpha")
        fake.fail_restore = 2  # the blob and then the log restore both fail
        with pytest.raises(ProviderError, match="restore failed"):
            await orch.run_turn("alpha", "lost before it started")
        await orch.run_turn("alpha", "two")
        await orch.close()
        orch = await Orchestrator.open(root, registry=registry(fake=fake))
        await orch.run_turn("alpha", "three")
        ids = [t.turn_id for t in orch.history("alpha")]
        assert len(ids) == len(set(ids)) == 3, ids
        starts = [d["turn_id"] for e, d in log_events(orch, "alpha") if e == events.TURN_START]
        assert len(starts) == len(set(starts))
        await orch.close()

    run(go())


def test_a_turn_survives_its_log_being_closed_by_the_open_log_bound(root: Path) -> None:
    """Many agents: the pool of open logs is bounded, so a long turn's log can be closed
    (least recently used) while other agents write theirs; the turn must still commit."""
    gate = Gate()

    async def go() -> None:
        orch = await Orchestrator.open(root, registry=registry(slow=ScriptedProvider(gate)))
        orch.logs._max_open = 2  # as if hundreds of agents were writing meanwhile
        await orch.create_root("boss")
        await orch.run_turn("boss", "@spawn a\n@spawn b\n@spawn c")
        await orch.create_root("slowpoke", provider="slow")
        turn = asyncio.create_task(orch.run_turn("slowpoke", "park for a while"))
        await gate.entered.wait()
        await orch.run_turn("boss", "@send a one\n@send b two\n@send c three")
        assert await orch.run_pending() == 3
        gate.release.set()
        result = await turn
        assert [t.turn_id for t in orch.history("slowpoke")] == [result.turn_id]
        assert orch.get("slowpoke").state is AgentState.IDLE
        await orch.close()

    run(go())


def test_a_slow_suspend_survives_its_log_being_closed_meanwhile(root: Path) -> None:
    gate = Gate()

    async def go() -> None:
        orch = await Orchestrator.open(root, registry=registry(slow=slow_suspend_provider(gate)))
        orch.logs._max_open = 2
        await orch.create_root("boss")
        await orch.run_turn("boss", "@spawn a\n@spawn b\n@spawn c")
        await orch.create_root("sleepy", provider="slow")
        await orch.run_turn("sleepy", "one")
        eviction = asyncio.create_task(orch.evict("sleepy"))
        await gate.entered.wait()
        await orch.run_turn("boss", "@send a one\n@send b two\n@send c three")
        gate.release.set()
        assert await eviction is True
        suspended = [d for e, d in log_events(orch, "sleepy") if e == events.SUSPEND_RESULT]
        assert len(suspended) == 1 and suspended[0]["state_size"] > 0
        assert (await orch.run_turn("sleepy", "two")).response.startswith("#2 ")
        await orch.close()

    run(go())


def test_concurrent_creates_of_one_name_leave_exactly_one_agent(root: Path) -> None:
    class Yielding(ScriptedProvider):
        """Creating a real session takes time (a process, a connection): it yields."""

        async def create(self, model: str, system_prompt: str, context: AgentContext) -> Any:
            await asyncio.sleep(0.01)
            return await super().create(model, system_prompt, context)

    async def go() -> None:
        orch = await Orchestrator.open(root, registry=registry(slow=Yielding()))
        results = await asyncio.gather(
            orch.create_root("twin", provider="slow"),
            orch.create_root("twin", provider="slow"),
            return_exceptions=True,
        )
        refused = [r for r in results if isinstance(r, BaseException)]
        assert len(refused) == 1 and isinstance(refused[0], NameCollisionError)
        assert [i.path for i in orch.agents()] == ["twin"]
        await orch.close()
        orch = await Orchestrator.open(root, registry=registry(slow=Yielding()))
        # the refused one must not come back
        assert [i.path for i in orch.agents()] == ["twin"]
        report = orch.recovery_report
        assert report is not None and report.detached == []
        await orch.close()

    run(go())


def test_a_turn_on_an_agent_being_evicted_waits_for_the_eviction(root: Path) -> None:
    gate = Gate()

    async def go() -> None:
        orch = await Orchestrator.open(
            root, slots=1, registry=registry(slow=slow_suspend_provider(gate, restorable=True))
        )
        await orch.create_root("first", provider="slow")
        await orch.run_turn("first", "one")
        second = asyncio.create_task(orch.create_root("second", provider="slow"))
        await gate.entered.wait()  # first is being suspended to make room
        again = asyncio.create_task(orch.run_turn("first", "two"))
        await asyncio.sleep(0.01)
        gate.release.set()
        await second
        result = await again
        assert result.response.startswith("#2 ")
        assert [t.prompt for t in orch.history("first")] == ["one", "two"]
        await orch.close()

    run(go())


def test_a_root_terminated_while_its_slot_is_made_does_not_keep_the_slot(root: Path) -> None:
    gate = Gate()

    async def go() -> None:
        reg = registry(slow=slow_suspend_provider(gate))
        orch = await Orchestrator.open(root, slots=1, registry=reg)
        await orch.create_root("first", provider="slow")
        creating = asyncio.create_task(orch.create_root("second", provider="slow"))
        await gate.entered.wait()  # "second" is committed; "first" is being suspended
        (second,) = await orch.terminate("second")
        gate.release.set()
        with pytest.raises(AgentError, match="terminated while"):
            await creating
        assert not orch.mux.is_live(second)
        assert (await orch.run_turn("first", "still works")).response.startswith("#1 ")
        await orch.close()
        orch = await Orchestrator.open(root, slots=1, registry=reg)
        assert [i.path for i in orch.agents()] == ["first"]
        await orch.close()

    run(go())
