"""End to end on real files with one multiplexer slot.

A root spawns two children; they exchange a request/reply (parent to child and
child to child) and broadcasts; with a single slot every wake evicts the last
session and restores the next one. At the end every conversation, every inbox
(the user's too) and every waiting flag must be exactly right, the provider's
own state must have followed every eviction (the scripted provider's digest
chains every prompt it was given), and a restart must change none of it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from substrat import events
from substrat.agents import AgentState
from substrat.checkpointer import CheckpointPolicy
from substrat.errors import ProviderError
from substrat.eventlog import decode_line, read_log
from substrat.orchestrator import Orchestrator
from substrat.providers.base import AgentContext, TurnRecord
from substrat.providers.fake import FakeProvider
from substrat.providers.registry import ProviderRegistry
from substrat.providers.scripted import ScriptedProvider, chain_digest, reply_header
from substrat.session import SessionState, SessionStore
from tests.support.kill import abandon

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def assert_conversation_continuous(orch: Orchestrator, agent: str) -> None:
    """Each response names its turn number and the digest of every prompt so far."""
    digest = ""
    for number, turn in enumerate(orch.history(agent), start=1):
        digest = chain_digest(digest, turn.prompt)
        assert turn.response.startswith(reply_header(number, digest)), (agent, number)


def logged(orch: Orchestrator, agent: str, event: str) -> list[dict[str, Any]]:
    path = orch.logs.path(orch.get(agent).session_id)
    return [e["data"] for e in read_log(path).entries if e["event"] == event]


def test_root_and_two_children_talk_through_evictions(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root, slots=1)
        await orch.create_root("lead", "coordinate")
        spawn = await orch.run_turn("lead", "@spawn alice adder\n@spawn bob multiplier")
        alice, bob = (orch.get(p) for p in ("lead/alice", "lead/bob"))
        lead = orch.get("lead")
        assert spawn.spawned == [alice.agent_id, bob.agent_id]

        # lead asks alice; alice's request carries a directive: she asks bob in turn
        kickoff = await orch.run_turn(
            "lead", "@ask alice @ask bob what is six times seven\n@broadcast kickoff"
        )
        ask_alice, bcast_alice, bcast_bob = kickoff.messages_sent
        assert orch.get("lead").state is AgentState.WAITING
        assert [m["message_id"] for m in orch.inspect("lead/alice")["inbox"]] == [
            ask_alice,
            bcast_alice,
        ]
        assert [m["message_id"] for m in orch.inspect("lead/bob")["inbox"]] == [bcast_bob]

        # alice (request + broadcast), bob (broadcast + alice's request), lead, alice
        assert await orch.run_pending() == 4
        a_turns, b_turns, l_turns = (orch.history(x) for x in ("lead/alice", "lead/bob", "lead"))
        assert len(a_turns) == 2 and len(b_turns) == 1 and len(l_turns) == 3
        assert ask_alice in a_turns[0].prompt and bcast_alice in a_turns[0].prompt
        (a_complete,) = logged(orch, "lead/alice", events.TURN_COMPLETE)[:1]
        ask_bob, reply_to_lead = a_complete["effects"]["messages"]
        assert (ask_bob["recipient"], ask_bob["kind"]) == (bob.agent_id, "request")
        assert (reply_to_lead["recipient"], reply_to_lead["reply_to"]) == (lead.agent_id, ask_alice)
        assert reply_to_lead["payload"] == a_turns[0].response
        assert sorted(a_complete["effects"]["delivered"]) == sorted([ask_alice, bcast_alice])
        assert bcast_bob in b_turns[0].prompt and ask_bob["message_id"] in b_turns[0].prompt
        (b_complete,) = logged(orch, "lead/bob", events.TURN_COMPLETE)
        (reply_to_alice,) = b_complete["effects"]["messages"]
        assert reply_to_alice["reply_to"] == ask_bob["message_id"]
        assert reply_to_alice["payload"] == b_turns[0].response
        assert reply_to_lead["message_id"] in l_turns[2].prompt
        assert reply_to_alice["message_id"] in a_turns[1].prompt

        # bob broadcasts to his sibling; lead reports to the user
        await orch.run_turn("lead", "@send bob @broadcast hello siblings\n@complete phase one")
        assert await orch.run_pending() == 2  # bob, then alice
        (bob_bcast,) = logged(orch, "lead/bob", events.TURN_COMPLETE)[1]["effects"]["messages"]
        assert (bob_bcast["kind"], bob_bcast["recipient"]) == ("broadcast", alice.agent_id)
        assert "hello siblings" in orch.history("lead/alice")[-1].prompt

        # every inbox drained, nobody waiting, the user holds the one result
        for info in orch.agents():
            assert info.pending_messages == 0 and info.state is AgentState.IDLE, info.path
            assert orch.tree.get(info.agent_id).waiting_on == {}
            assert_conversation_continuous(orch, info.agent_id)
        assert [(m.kind, m.payload) for m in orch.user_inbox()] == [("result", "phase one")]

        # one slot: sessions really were evicted and restored, from their blobs
        assert orch.mux.evictions == 7 and orch.mux.live_count() == 1
        sources = {
            path: [d["source"] for d in logged(orch, path, events.SESSION_RESTORED)]
            for path in ("lead", "lead/alice", "lead/bob")
        }
        assert sources == {
            "lead": ["blob", "blob"],  # created live, then evicted twice
            "lead/alice": ["new", "blob", "blob"],  # a child starts on its first wake
            "lead/bob": ["new", "blob"],
        }
        suspends = {path: len(logged(orch, path, events.SUSPEND_RESULT)) for path in sources}
        assert suspends == {"lead": 3, "lead/alice": 2, "lead/bob": 2}  # alice is the live one
        expected = {
            info.path: (info.to_dict(), orch.history(info.agent_id)) for info in orch.agents()
        }
        user = orch.user_inbox()
        await orch.close()

        # a clean restart keeps all of it, and every agent goes on where it was
        orch = await Orchestrator.open(root, slots=1)
        assert {i.path: (i.to_dict(), orch.history(i.agent_id)) for i in orch.agents()} == expected
        assert orch.user_inbox() == user
        states = {s.state for s in SessionStore(root).scan(quarantine=False).sessions}
        assert states == {SessionState.SUSPENDED}
        for info in orch.agents():
            turns = len(orch.history(info.agent_id))
            result = await orch.run_turn(info.agent_id, "are you still there?")
            assert result.response.startswith(f"#{turns + 1} ")
            assert_conversation_continuous(orch, info.agent_id)
        await orch.close()

    run(go())


def documented_events() -> dict[str, set[str]]:
    """event name -> the field names its row in docs/events.md mentions."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "events.md"
    table: dict[str, set[str]] = {}
    for line in doc.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"`[a-z]+(\.[a-z]+)?`", cells[0]):
            table[cells[0].strip("`")] = set(re.findall(r"`([a-z_]+)`", cells[3]))
    return table


def test_every_event_the_code_writes_is_documented_with_its_fields(root: Path) -> None:
    class Kill(BaseException):
        """Stops the process dead: nothing in substrat catches it."""

    def kill(prompt: str, turns: list[TurnRecord], ctx: AgentContext) -> str:
        raise Kill()

    fake = FakeProvider()
    registry = ProviderRegistry()
    registry.register("fake", fake)
    registry.register("killer", ScriptedProvider(kill))
    held: list[Orchestrator] = []

    async def go() -> None:
        orch = await Orchestrator.open(root, registry=registry, slots=1)
        held.append(orch)
        await orch.create_root("lead", provider="fake")
        await orch.run_turn("lead", "@spawn a\n@spawn b\n@ask a hi\n@complete done")
        await orch.run_pending()
        fake.fail_send = 1
        with pytest.raises(ProviderError):
            await orch.run_turn("lead/b", "fails")
        fake.fail_suspend = 1
        await orch.run_turn("lead/b", "@send parent ok")
        await orch.collect_user_inbox()
        await orch.terminate("lead", cascade=True)
        await orch.create_root("doomed", provider="killer")
        await orch.run_turn("doomed", "this turn is cut by a kill")

    with pytest.raises(Kill):
        run(go())
    abandon(held[0])  # the kill closed the descriptors; nothing else ran

    async def recover() -> None:  # recovery closes the lost turn in the log
        deleting = CheckpointPolicy(every_entries=2, segment_bytes=400, compaction="delete")
        orch = await Orchestrator.open(root, registry=registry, slots=1, checkpoints=deleting)
        assert orch.recovery_report is not None and orch.recovery_report.lost_turns
        await orch.create_root("keeper", provider="fake")
        for i in range(8):  # its first segments are deleted: its log gets a base
            await orch.run_turn("keeper", f"turn {i}")
        await orch.close()

    run(recover())
    table = documented_events()
    assert set(table) == set(events.KNOWN_EVENTS)
    seen: set[str] = set()
    logs = [*root.glob("agents/*/events.jsonl"), root / "user" / "events.jsonl"]
    entries = [
        entry
        for log in [*logs, root / "roots" / "events.jsonl", root / "checkpoints" / "events.jsonl"]
        for entry in read_log(log).entries
    ]
    bases = [decode_line(base.read_bytes()[:-1]) for base in root.glob("agents/*/events.base")]
    assert bases, "a log's base was written"
    starts = [decode_line(s.read_bytes()[:-1]) for s in root.glob("agents/*/events.start")]
    assert starts, "a log's start record was written"
    for entry in [*entries, *bases, *starts]:
        assert isinstance(entry, dict)
        seen.add(entry["event"])
        undocumented = set(entry["data"]) - table[entry["event"]]
        assert not undocumented, (entry["event"], undocumented)
    # everything but the two events only real providers write, and the incident log's
    # (a log restored from an older backup: tests/integration/test_incidents.py checks them
    # against this table)
    assert seen == set(events.KNOWN_EVENTS) - {
        events.TOOL_REPAIRED,
        events.PROVIDER_SESSION,
        events.INCIDENT_RECORDED,
        events.INCIDENT_ACKNOWLEDGED,
    }
