"""Agent tools: staging, idempotency, refusals as text, and the commit that applies them.

A scripted provider whose script makes exactly the tool calls a test lists
drives the tools through the same path a model does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from substrat import events
from substrat.agents import USER, AgentState
from substrat.eventlog import read_log
from substrat.orchestrator import Orchestrator
from substrat.providers.base import AgentContext, TurnRecord
from substrat.providers.registry import ProviderRegistry
from substrat.providers.scripted import ScriptedProvider
from substrat.tools import (
    MAX_CALLS_PER_TURN,
    MAX_CHILDREN_PER_AGENT,
    MAX_INSTRUCTIONS_CHARS,
    MAX_PAYLOAD_CHARS,
    TOOL_SPECS,
    idempotency_key,
)

T = TypeVar("T")
Call = tuple[str, Any, str]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class ToolScript:
    """Makes the queued calls in the next turn and keeps their results."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.results: list[str] = []
        self.contexts: list[AgentContext] = []

    async def __call__(self, prompt: str, turns: list[TurnRecord], ctx: AgentContext) -> str:
        self.contexts.append(ctx)
        calls, self.calls = self.calls, []
        self.results = [await ctx.call_tool(name, args, call_id) for name, args, call_id in calls]
        return f"made {len(calls)} calls"


async def setup(root: Path) -> tuple[Orchestrator, ToolScript]:
    script = ToolScript()
    registry = ProviderRegistry()
    registry.register("scripted", ScriptedProvider)  # plain directives, for setting up
    registry.register("tools", ScriptedProvider(script))
    orch = await Orchestrator.open(root, registry=registry)
    return orch, script


async def calls(orch: Orchestrator, script: ToolScript, agent: str, *queued: Call) -> list[str]:
    script.calls = list(queued)
    await orch.run_turn(agent, "go")
    return script.results


async def family(orch: Orchestrator, script: ToolScript) -> None:
    await orch.create_root("boss", provider="tools")
    await calls(
        orch,
        script,
        "boss",
        ("spawn_agent", {"name": "a"}, "1"),
        ("spawn_agent", {"name": "b"}, "2"),
    )


def committed_effects(orch: Orchestrator, agent: str) -> dict[str, Any]:
    path = orch.logs.path(orch.get(agent).session_id)
    entries = [e for e in read_log(path).entries if e["event"] == events.TURN_COMPLETE]
    return dict(entries[-1]["data"]["effects"])


def test_tool_specs_name_every_tool() -> None:
    assert [s.name for s in TOOL_SPECS] == [
        "spawn_agent",
        "send_message",
        "broadcast",
        "check_inbox",
        "inspect_agent",
        "list_children",
        "complete",
        "terminate",
    ]
    for spec in TOOL_SPECS:
        assert spec.parameters["type"] == "object" and spec.description


def test_idempotency_key_prefers_the_call_id() -> None:
    assert idempotency_key("a", "t", {"x": 1}, "call-7") == "call-7"
    one = idempotency_key("a", "t", {"x": 1, "y": 2}, "")
    assert one == idempotency_key("a", "t", {"y": 2, "x": 1}, "")
    assert one != idempotency_key("b", "t", {"x": 1, "y": 2}, "")
    assert one != idempotency_key("a", "t", {"x": 2, "y": 2}, "")


def test_unknown_tools_and_bad_arguments_come_back_as_text(root: Path) -> None:
    async def go() -> None:
        orch, script = await setup(root)
        await family(orch, script)
        results = await calls(
            orch,
            script,
            "boss",
            ("launch_rockets", {}, "1"),
            ("spawn_agent", {"name": "c", "colour": "red"}, "2"),
            ("send_message", {"text": "no recipient"}, "3"),
            ("send_message", {"recipient": 42, "text": "hi"}, "4"),
            ("inspect_agent", {"name": ["a"]}, "5"),
            ("terminate", {"name": None}, "6"),
            ("send_message", {"recipient": "a", "text": 7}, "7"),
            ("spawn_agent", {"name": "../etc"}, "8"),
            ("spawn_agent", {"name": "parent"}, "9"),
        )
        assert results[0].startswith("error: unknown tool 'launch_rockets'; the tools are: ")
        # Bad arguments are said in the tool's terms, never as a Python TypeError.
        assert results[1] == (
            "error: spawn_agent has no argument colour; its arguments are: name, instructions"
        )
        assert results[2] == "error: send_message needs the argument recipient (string)"
        assert results[3] == "error: recipient must be a string (got a number)"
        assert all(r.startswith("error: ") for r in results), results
        assert not any("positional" in r or "()" in r for r in results), results
        assert "text must be a string" in results[6]
        assert "invalid agent name" in results[7]
        assert "'parent' is reserved" in results[8]  # it would shadow the parent alias
        # the turn itself committed, with nothing staged
        last = orch.history("boss")[-1].response
        assert last.startswith("#2 ") and last.endswith("made 9 calls")
        effects = committed_effects(orch, "boss")
        assert effects["spawns"] == effects["messages"] == effects["terminations"] == []
        assert [i.path for i in orch.agents()] == ["boss", "boss/a", "boss/b"]
        await orch.close()

    run(go())


def test_a_repeated_call_returns_the_first_result_and_stages_once(root: Path) -> None:
    async def go() -> None:
        orch, script = await setup(root)
        await family(orch, script)
        same = ("send_message", {"recipient": "a", "text": "once"}, "k1")
        hashed = ("send_message", {"recipient": "b", "text": "once"}, "")
        results = await calls(orch, script, "boss", same, same, hashed, hashed)
        assert results[0] == results[1] and results[2] == results[3]
        effects = committed_effects(orch, "boss")
        assert [m["payload"] for m in effects["messages"]] == ["once", "once"]
        assert len(effects["keys"]) == 2
        assert orch.get("boss/a").pending_messages == orch.get("boss/b").pending_messages == 1
        await orch.close()

    run(go())


def test_calls_per_turn_are_bounded(root: Path) -> None:
    async def go() -> None:
        orch, script = await setup(root)
        await orch.create_root("boss", provider="tools")
        queued = [("list_children", {}, f"c{i}") for i in range(MAX_CALLS_PER_TURN + 1)]
        results = await calls(orch, script, "boss", *queued)
        assert results[-2] == "no children"
        assert results[-1] == f"error: more than {MAX_CALLS_PER_TURN} tool calls in one turn"
        await orch.close()

    run(go())


def test_tools_outside_a_turn_are_refused(root: Path) -> None:
    async def go() -> None:
        orch, script = await setup(root)
        await orch.create_root("boss", provider="tools")
        await calls(orch, script, "boss")
        late = await script.contexts[0].call_tool("spawn_agent", {"name": "x"}, "late")
        assert late == "error: tools can only be called during a turn"
        assert orch.get("boss").children == []
        await orch.close()

    run(go())


def test_spawn_limits(root: Path) -> None:
    async def go() -> None:
        orch, script = await setup(root)
        await orch.create_root("boss", provider="tools")
        long = "x" * (MAX_INSTRUCTIONS_CHARS + 1)
        results = await calls(
            orch,
            script,
            "boss",
            ("spawn_agent", {"name": "a", "instructions": long}, "1"),
            ("spawn_agent", {"name": "a", "instructions": 5}, "2"),
            ("spawn_agent", {"name": "a"}, "3"),
            ("spawn_agent", {"name": "a"}, "4"),
        )
        assert "instructions must be a string" in results[0] and "instructions must" in results[1]
        assert results[2].startswith("spawned a (")
        assert results[3] == "error: you already have a child named 'a'"
        queued = [("spawn_agent", {"name": f"w{i}"}, str(i)) for i in range(MAX_CHILDREN_PER_AGENT)]
        results = await calls(orch, script, "boss", *queued)
        assert results[-2].startswith("spawned")
        assert results[-1] == f"error: at most {MAX_CHILDREN_PER_AGENT} children per agent"
        assert len(orch.get("boss").children) == MAX_CHILDREN_PER_AGENT
        await orch.close()

    run(go())


def test_send_message_resolves_names_relative_to_the_caller(root: Path) -> None:
    async def go() -> None:
        orch, script = await setup(root)
        await family(orch, script)
        boss, a, b = (orch.get(p) for p in ("boss", "boss/a", "boss/b"))
        results = await calls(
            orch,
            script,
            "boss/a",
            ("send_message", {"recipient": "b", "text": "sibling by name"}, "1"),
            ("send_message", {"recipient": "parent", "text": "to boss"}, "2"),
            ("send_message", {"recipient": "boss/b", "text": "by path"}, "3"),
            ("send_message", {"recipient": b.agent_id, "text": "by id"}, "4"),
            ("send_message", {"recipient": "user", "text": "to you"}, "5"),
            ("send_message", {"recipient": "a", "text": "to myself"}, "6"),
            ("send_message", {"recipient": "b", "text": "x" * (MAX_PAYLOAD_CHARS + 1)}, "7"),
            ("spawn_agent", {"name": "kid"}, "8"),
            (
                "send_message",
                {"recipient": "kid", "text": "staged child", "expect_reply": True},
                "9",
            ),
        )
        assert results[0].startswith("sent ") and results[0].endswith(" to boss/b")
        assert results[1].endswith(" to boss") and results[4].endswith(" to user")
        assert results[5] == "error: an agent cannot message itself"
        assert results[6] == f"error: message is over {MAX_PAYLOAD_CHARS} characters"
        kid = orch.get("boss/a/kid")
        # the child was only staged, not yet in the tree: the result names it by path all the same
        assert results[8].endswith(" to boss/a/kid; the reply will come to your inbox")
        got = {
            p: [(m["sender"], m["kind"], m["payload"]) for m in orch.inspect(p)["inbox"]]
            for p in ("boss", "boss/b", "boss/a/kid")
        }
        assert got == {
            "boss": [(a.agent_id, "notification", "to boss")],
            "boss/b": [
                (a.agent_id, "notification", t) for t in ("sibling by name", "by path", "by id")
            ],
            "boss/a/kid": [(a.agent_id, "request", "staged child")],
        }
        assert [m.payload for m in orch.user_inbox()] == ["to you"]
        assert orch.get("boss/a").state is AgentState.WAITING
        assert list(orch.tree.get(a.agent_id).waiting_on.values()) == [kid.agent_id]
        assert boss.agent_id != a.agent_id
        await orch.close()

    run(go())


def test_broadcast_reaches_children_of_a_root_and_siblings_of_a_child(root: Path) -> None:
    async def go() -> None:
        orch, script = await setup(root)
        await family(orch, script)
        await calls(orch, script, "boss", ("spawn_agent", {"name": "c"}, "1"))
        r = await calls(orch, script, "boss", ("broadcast", {"text": "all hands"}, "1"))
        assert r == ["broadcast to 3 agents"]
        r = await calls(orch, script, "boss/b", ("broadcast", {"text": "from b"}, "1"))
        assert r == ["broadcast to 2 agents"]
        got = {
            p: [m["payload"] for m in orch.inspect(p)["inbox"]]
            for p in ("boss/a", "boss/b", "boss/c")
        }
        assert got == {
            "boss/a": ["all hands", "from b"],
            "boss/b": ["all hands"],
            "boss/c": ["all hands", "from b"],
        }
        assert all(m["kind"] == "broadcast" for p in got for m in orch.inspect(p)["inbox"])
        assert orch.inspect("boss")["inbox"] == []
        await orch.close()

    run(go())


def test_check_inbox_claims_and_the_commit_delivers_and_replies(root: Path) -> None:
    async def go() -> None:
        orch, script = await setup(root)
        await family(orch, script)
        await calls(
            orch,
            script,
            "boss",
            ("send_message", {"recipient": "a", "text": "q?", "expect_reply": True}, "1"),
            ("send_message", {"recipient": "a", "text": "fyi"}, "2"),
        )
        boss = orch.get("boss")
        assert boss.state is AgentState.WAITING
        r = await calls(orch, script, "boss/a", ("check_inbox", {}, "1"), ("check_inbox", {}, "2"))
        assert "q?" in r[0] and "fyi" in r[0] and "from boss]" in r[0]
        assert r[1] == "inbox empty"
        effects = committed_effects(orch, "boss/a")
        assert len(effects["delivered"]) == 2
        (reply,) = effects["messages"]
        assert reply["kind"] == "reply" and reply["payload"].endswith("\nmade 2 calls")
        assert reply["payload"] == orch.history("boss/a")[-1].response
        assert orch.get("boss/a").pending_messages == 0
        (got,) = orch.inboxes.inbox(boss.agent_id).all()
        assert got.message_id == reply["message_id"] and got.reply_to in effects["delivered"]
        assert orch.get("boss").state is AgentState.IDLE
        a_log = [
            e["event"] for e in read_log(orch.logs.path(orch.get("boss/a").session_id)).entries
        ]
        assert a_log[-1] == events.MESSAGE_DELIVERED
        await orch.close()

    run(go())


def test_inspect_list_children_and_complete(root: Path) -> None:
    async def go() -> None:
        orch, script = await setup(root)
        await family(orch, script)
        r = await calls(
            orch,
            script,
            "boss",
            ("list_children", {}, "1"),
            ("spawn_agent", {"name": "c"}, "2"),
            ("list_children", {}, "3"),
            ("inspect_agent", {"name": "a"}, "4"),
            ("inspect_agent", {"name": "user"}, "5"),
            ("inspect_agent", {"name": "nobody"}, "6"),
            ("complete", {"result": "all done"}, "7"),
        )
        assert r[0] == "a (idle), b (idle)"
        assert r[2] == "a (idle), b (idle), c (starting)"
        shown = json.loads(r[3])
        assert (shown["path"], shown["state"]) == ("boss/a", "idle")
        assert r[4] == "user: the human operator"
        assert r[5].startswith("error: ") and "no live agent" in r[5]
        assert [(m.kind, m.payload, m.recipient) for m in orch.user_inbox()] == [
            ("result", "all done", USER)
        ]
        r = await calls(orch, script, "boss/c", ("complete", {"result": "c done"}, "1"))
        assert r[0].endswith(" sent to boss")
        assert [(m["kind"], m["payload"]) for m in orch.inspect("boss")["inbox"]] == [
            ("result", "c done")
        ]
        await orch.close()

    run(go())


def test_terminate_tool_stages_and_applies_after_commit(root: Path) -> None:
    async def go() -> None:
        orch, script = await setup(root)
        await family(orch, script)
        b = orch.get("boss/b").agent_id
        r = await calls(
            orch,
            script,
            "boss",
            ("terminate", {"name": "b"}, "1"),
            ("terminate", {"name": "b"}, "2"),
            ("terminate", {"name": "zzz"}, "3"),
            ("send_message", {"recipient": "b", "text": "still here?"}, "4"),
        )
        assert r[0] == "b will be terminated when this turn ends"
        assert r[1] == "error: b is already being terminated"
        assert r[2] == "error: you have no live child named 'zzz'"
        assert r[3].startswith("sent ")  # b is alive until the commit
        assert committed_effects(orch, "boss")["terminations"] == [b]
        assert [i.path for i in orch.agents()] == ["boss", "boss/a"]
        await orch.close()

    run(go())
