"""The orchestrator's public API on real files: the root, creation, turns, termination,
the user inbox and notifications."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from substrat import events
from substrat.agents import USER, AgentState
from substrat.errors import (
    AgentBusyError,
    AgentNotFoundError,
    BadInputError,
    HasChildrenError,
    NameCollisionError,
    NotARootError,
    ProviderError,
    RootUnusableError,
    UnknownProviderError,
)
from substrat.eventlog import read_log
from substrat.orchestrator import Orchestrator
from substrat.prompts import MAX_PROMPT_CHARS
from substrat.providers.fake import FakeProvider
from substrat.providers.scripted import ScriptedProvider
from substrat.rootdir import MARKER_NAME
from substrat.session import SessionState, SessionStore
from tests.support.orch_api import Gate, log_events, record_state, registry, run

# -- the root directory ----------------------------------------------------------


def test_open_refuses_a_directory_that_is_not_a_root_and_writes_nothing(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("mine\n")
    (project / "src").mkdir()
    with pytest.raises(NotARootError, match=r"not a substrat root.*README\.md"):
        run(Orchestrator.open(project))
    assert sorted(p.name for p in project.iterdir()) == ["README.md", "src"]


def test_open_takes_a_root_a_crash_left_with_substrat_names_only(tmp_path: Path) -> None:
    """A library root has no marker; a crash can leave ``user/`` made and ``agents/`` not."""
    left = tmp_path / "left"
    (left / "user").mkdir(parents=True)

    async def go() -> None:
        orch = await Orchestrator.open(left, registry=registry())
        await orch.create_root("lead", "You lead.", provider="scripted")
        await orch.close()

    run(go())
    assert (left / "agents").is_dir()


def test_open_does_not_look_into_a_root_of_substrat_names_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library root has no marker, so every open of it found it a root from before the
    marker by listing agents/; only strangers matter to an open, so it lists the top only."""
    from substrat import rootdir

    async def go(root: Path) -> None:
        orch = await Orchestrator.open(root, registry=registry())
        await orch.create_root("lead", "You lead.", provider="scripted")
        await orch.close()

    root = tmp_path / "lib"
    run(go(root))
    assert MARKER_NAME not in {p.name for p in root.iterdir()}
    assert rootdir.inspect(root).state is rootdir.RootState.LEGACY  # what a CLI start finds

    def looked(*args: object) -> None:
        raise AssertionError("the open looked into agents/")

    async def reopen() -> None:
        orch = await Orchestrator.open(root, registry=registry())
        await orch.close()

    monkeypatch.setattr(rootdir, "_substrat_evidence", looked)
    run(reopen())  # accepted without a look
    (root / "notes.txt").write_text("mine\n")
    with pytest.raises(NotARootError, match=r"not a substrat root.*notes\.txt"):
        rootdir.refuse_strangers(root)


def test_open_refuses_a_root_of_a_newer_format(tmp_path: Path) -> None:
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / MARKER_NAME).write_text(json.dumps({"format": "substrat-root", "version": 99}))
    with pytest.raises(RootUnusableError, match="newer"):
        run(Orchestrator.open(newer))
    assert [p.name for p in newer.iterdir()] == [MARKER_NAME]


# -- creating roots --------------------------------------------------------------


def test_create_root_is_logged_and_recorded(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        info = await orch.create_root("alpha", "be brief")
        assert (info.name, info.path, info.parent_id, info.state) == (
            "alpha",
            "alpha",
            None,
            AgentState.IDLE,
        )
        assert (info.provider, info.model, info.instructions) == (
            "scripted",
            "directives",
            "be brief",
        )
        assert orch.get("alpha") == orch.get(info.agent_id) == info
        logged = log_events(orch, "alpha")
        assert [e for e, _ in logged] == [events.SESSION_CREATED, events.AGENT_CREATED]
        assert logged[0][1] == {
            "provider": "scripted",
            "model": "directives",
            "system_prompt": "be brief",
        }
        assert logged[1][1] == {
            "agent_id": info.agent_id,
            "name": "alpha",
            "parent_session_id": None,
            "instructions": "be brief",
        }
        # live, but its record is the one written before the commit point: ACTIVE is a
        # state in memory only (SessionStore.activate)
        assert orch.sessions[info.session_id].state is SessionState.ACTIVE
        assert record_state(orch, info.session_id) is SessionState.CREATED
        await orch.close()
        assert record_state(orch, info.session_id) is SessionState.SUSPENDED

    run(go())


@pytest.mark.parametrize("name", ["", "a/b", "-x", "user", "x" * 65, "has space"])
def test_create_root_refuses_bad_names_and_writes_nothing(root: Path, name: str) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        with pytest.raises(ValueError, match=r"agent name|reserved"):
            await orch.create_root(name)
        assert orch.agents() == []
        assert not (root / "agents").exists() or not list((root / "agents").iterdir())
        await orch.close()

    run(go())


def test_create_root_refuses_a_taken_name_and_an_unknown_provider(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root, registry=registry())
        await orch.create_root("alpha")
        with pytest.raises(NameCollisionError, match="pick another name"):
            await orch.create_root("alpha")
        with pytest.raises(UnknownProviderError, match="registered: scripted"):
            await orch.create_root("beta", provider="nope")
        assert [i.path for i in orch.agents()] == ["alpha"]
        assert len(list((root / "agents").iterdir())) == 1
        await orch.close()

    run(go())


# -- turns -------------------------------------------------------------------------


def test_run_turn_by_path_or_id_streams_chunks_and_builds_history(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        info = await orch.create_root("alpha")
        chunks: list[str] = []
        first = await orch.run_turn("alpha", "hello\n@children\n@children", on_chunk=chunks.append)
        assert "".join(chunks) == first.response and len(chunks) > 1

        async def async_sink(text: str) -> None:
            chunks.append(text)

        second = await orch.run_turn(info.agent_id, "again", on_chunk=async_sink)
        assert (first.turn_id, second.turn_id) == ("t1", "t2")
        assert first.response.startswith("#1 ") and second.response.startswith("#2 ")
        history = orch.history("alpha")
        assert [(t.turn_id, t.prompt, t.response) for t in history] == [
            ("t1", "hello\n@children\n@children", first.response),
            ("t2", "again", second.response),
        ]
        assert history[1].transcript == [
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": second.response},
        ]
        await orch.close()

    run(go())


def test_run_turn_refuses_bad_prompts_and_unknown_agents(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        await orch.create_root("alpha")
        with pytest.raises(TypeError):
            await orch.run_turn("alpha", 42)  # type: ignore[arg-type]
        with pytest.raises(BadInputError, match="longer than 262144 characters"):
            await orch.run_turn("alpha", "x" * (MAX_PROMPT_CHARS + 1))
        # refused as the CLI refuses it: a blank prompt is a turn nobody meant
        for blank in ("", " \n\t"):
            with pytest.raises(BadInputError, match="the prompt is empty; nothing was sent"):
                await orch.run_turn("alpha", blank)
        with pytest.raises(AgentNotFoundError, match="agent list"):
            await orch.run_turn("alpha/ghost", "hi")
        assert orch.history("alpha") == []
        assert [e for e, _ in log_events(orch, "alpha")] == [
            events.SESSION_CREATED,
            events.AGENT_CREATED,
        ]
        await orch.close()

    run(go())


def test_turn_effects_are_applied_after_the_commit(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        boss = await orch.create_root("boss")
        result = await orch.run_turn(
            "boss", "@spawn a worker one\n@send a welcome\n@complete all set"
        )
        a = orch.get("boss/a")
        assert result.spawned == [a.agent_id]
        assert len(result.messages_sent) == 2
        assert (a.parent_id, a.instructions, a.path) == (boss.agent_id, "worker one", "boss/a")
        assert orch.get("boss").children == [a.agent_id]
        (note,) = orch.inspect("boss/a")["inbox"]
        assert (note["sender"], note["kind"], note["payload"]) == (
            boss.agent_id,
            "notification",
            "welcome",
        )
        (mail,) = orch.user_inbox()
        assert (mail.sender, mail.kind, mail.payload) == (boss.agent_id, "result", "all set")
        complete = next(d for e, d in log_events(orch, "boss") if e == events.TURN_COMPLETE)
        effects = complete["effects"]
        assert [s["name"] for s in effects["spawns"]] == ["a"]
        assert [m["message_id"] for m in effects["messages"]] == result.messages_sent
        assert effects["terminations"] == [] and effects["delivered"] == []
        child_log = log_events(orch, "boss/a")
        assert child_log[1] == (
            events.AGENT_CREATED,
            {
                "agent_id": a.agent_id,
                "name": "a",
                "parent_session_id": boss.session_id,
                "instructions": "worker one",
            },
        )
        assert child_log[2][0] == events.MESSAGE_ENQUEUED
        assert record_state(orch, a.session_id) is SessionState.CREATED  # not run yet
        await orch.close()

    run(go())


def test_spawn_with_a_taken_name_is_refused_to_the_agent(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        await orch.create_root("boss")
        await orch.run_turn("boss", "@spawn a")
        result = await orch.run_turn("boss", "@spawn a\n@spawn b\n@spawn b")
        assert "already have a child named 'a'" in result.response
        assert "already have a child named 'b'" in result.response
        assert [orch.get(i).name for i in result.spawned] == ["b"]
        assert [i.path for i in orch.agents()] == ["boss", "boss/a", "boss/b"]
        await orch.close()

    run(go())


def test_concurrent_turn_on_the_same_agent_is_refused(root: Path) -> None:
    gate = Gate()

    async def go() -> None:
        orch = await Orchestrator.open(root, registry=registry(slow=ScriptedProvider(gate)))
        await orch.create_root("alpha", provider="slow")
        first = asyncio.create_task(orch.run_turn("alpha", "park one"))
        await gate.entered.wait()
        assert orch.get("alpha").state is AgentState.BUSY and orch.busy_turns == 1
        with pytest.raises(AgentBusyError, match="agent alpha is running a turn"):
            await orch.run_turn("alpha", "two")
        gate.release.set()
        assert (await first).response.endswith("done park one")
        assert orch.get("alpha").state is AgentState.IDLE and orch.busy_turns == 0
        assert [t.prompt for t in orch.history("alpha")] == ["park one"]
        await orch.close()

    run(go())


# -- failures ------------------------------------------------------------------------


def test_failed_turn_is_logged_and_the_agent_keeps_working(root: Path) -> None:
    fake = FakeProvider()

    async def go() -> None:
        orch = await Orchestrator.open(root, registry=registry(fake=fake))
        await orch.create_root("alpha", provider="fake")
        fake.fail_send = 1
        with pytest.raises(ProviderError, match="send failed"):
            await orch.run_turn("alpha", "@spawn never")
        fake.cut_after_chunks = 0
        with pytest.raises(ProviderError, match="stream cut"):
            await orch.run_turn("alpha", "@spawn never")
        assert orch.get("alpha").state is AgentState.IDLE and orch.get("alpha").children == []
        ok = await orch.run_turn("alpha", "third time")
        assert ok.turn_id == "t3" and ok.response.startswith("#1 ")  # the failures left no trace
        logged = [(e, d.get("turn_id")) for e, d in log_events(orch, "alpha")]
        assert logged[2:] == [
            (events.TURN_START, "t1"),
            (events.TURN_FAILED, "t1"),
            (events.SESSION_RESTORED, None),
            (events.TURN_START, "t2"),
            (events.TURN_FAILED, "t2"),
            (events.SESSION_RESTORED, None),
            (events.TURN_START, "t3"),
            (events.TURN_COMPLETE, "t3"),
        ]
        assert [t.turn_id for t in orch.history("alpha")] == ["t3"]
        await orch.close()

    run(go())


def test_failed_wake_keeps_the_messages_and_tells_the_parent(root: Path) -> None:
    fake = FakeProvider()

    async def go() -> None:
        orch = await Orchestrator.open(root, registry=registry(fake=fake))
        boss = await orch.create_root("boss", provider="fake")
        await orch.run_turn("boss", "@spawn a\n@send a job one")
        fake.fail_send = 1
        assert await orch.run_pending(max_turns=1) == 1
        a = orch.get("boss/a")
        assert a.state is AgentState.IDLE and a.pending_messages == 1
        (error,) = orch.inboxes.inbox(boss.agent_id).all()
        assert error.kind == "error" and "boss/a failed a turn" in error.payload
        assert await orch.run_pending() == 2  # a retries its message, boss reads the error
        assert orch.get("boss/a").pending_messages == 0
        assert "job one" in orch.history("boss/a")[-1].prompt
        await orch.close()

    run(go())


def test_cancelled_turn_leaves_the_agent_idle_and_wakeable(root: Path) -> None:
    gate = Gate()

    async def go() -> None:
        reg = registry(slow=ScriptedProvider(gate))
        orch = await Orchestrator.open(root, registry=reg)
        await orch.create_root("boss")
        await orch.run_turn("boss", "@spawn a")
        await orch.create_root("slowpoke", provider="slow")
        told: list[dict[str, Any]] = []
        orch.subscribe(
            lambda kind, payload: told.append(payload) if kind == "turn.failed" else None
        )
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(orch.run_turn("slowpoke", "park forever"), 0.05)
        node = orch.tree.resolve("slowpoke")
        assert node.state is AgentState.IDLE and orch.busy_turns == 0
        (event, data) = log_events(orch, "slowpoke")[-1]
        assert event == events.TURN_FAILED and data["error"] == "cancelled by the caller"
        # subscribers (the daemon's `watch`) are told what the log says, not a bare ""
        assert [t["error"] for t in told] == ["cancelled by the caller"]
        # messages reach it again, and the wake loop does not skip it
        await orch.run_turn("boss", "@send slowpoke hello there")
        gate.release.set()
        assert await orch.run_pending() == 1
        assert "hello there" in orch.history("slowpoke")[-1].prompt
        await orch.close()

    run(go())


# -- termination ---------------------------------------------------------------------------


def test_terminate_refuses_a_parent_without_cascade(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        await orch.create_root("boss")
        await orch.run_turn("boss", "@spawn a\n@send a @spawn a1")
        await orch.run_pending()
        with pytest.raises(HasChildrenError, match="cascade=True"):
            await orch.terminate("boss")
        with pytest.raises(HasChildrenError):
            await orch.terminate("boss/a")
        assert [i.path for i in orch.agents()] == ["boss", "boss/a", "boss/a/a1"]
        for info in orch.agents():
            assert events.AGENT_TERMINATED not in [e for e, _ in log_events(orch, info.path)]
        await orch.close()

    run(go())


def test_cascade_commits_on_the_target_then_goes_leaves_first(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        await orch.create_root("boss")
        await orch.create_root("other")
        await orch.run_turn("boss", "@spawn a\n@spawn b\n@send a @spawn a1")
        await orch.run_pending()
        ids = {i.path: i.agent_id for i in orch.agents()}
        sessions = {i.path: i.session_id for i in orch.agents()}
        seen: list[str] = []
        orch.subscribe(
            lambda kind, data: seen.append(data["agent_id"]) if kind == "agent.terminated" else None
        )
        gone = await orch.terminate("boss", cascade=True)
        assert gone == [ids["boss/a/a1"], ids["boss/a"], ids["boss/b"], ids["boss"]]
        assert seen == gone
        assert [i.path for i in orch.agents()] == ["other"]
        store = SessionStore(root)
        top = [
            e["data"]
            for e in read_log(store.log_path(sessions["boss"])).entries
            if e["event"] == events.AGENT_TERMINATED
        ]
        assert top == [{"agent_id": ids["boss"], "cascade": gone[:-1]}]
        for path in ("boss/a/a1", "boss/a", "boss/b"):
            (entry,) = [
                e["data"]
                for e in read_log(store.log_path(sessions[path])).entries
                if e["event"] == events.AGENT_TERMINATED
            ]
            assert entry == {"agent_id": ids[path], "by": ids["boss"]}
        assert all(
            store.load(s).state is SessionState.TERMINATED
            for p, s in sessions.items()
            if p != "other"
        )
        await orch.close()

    run(go())


def test_terminate_refuses_while_a_subtree_member_is_busy(root: Path) -> None:
    gate = Gate()

    async def go() -> None:
        orch = await Orchestrator.open(root, registry=registry(slow=ScriptedProvider(gate)))
        await orch.create_root("boss", provider="slow")
        await orch.run_turn("boss", "@spawn a")  # a inherits the provider
        node = orch.tree.resolve("boss/a")
        await orch.run_turn("boss", "@send a park here")
        wake = asyncio.create_task(orch.run_pending(max_turns=1))
        await gate.entered.wait()
        with pytest.raises(AgentBusyError, match="retry when idle"):
            await orch.terminate("boss", cascade=True)
        with pytest.raises(AgentBusyError):
            await orch.terminate("boss/a")
        gate.release.set()
        assert await wake == 1
        assert await orch.terminate("boss/a") == [node.agent_id]
        await orch.close()

    run(go())


def test_messages_to_a_terminated_agent_are_refused(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        await orch.create_root("boss")
        await orch.run_turn("boss", "@spawn a\n@spawn b\n@ask b hold on")
        b = orch.get("boss/b").agent_id
        assert orch.get("boss").state is AgentState.WAITING
        await orch.terminate("boss/b")
        assert orch.get("boss").state is AgentState.IDLE  # nobody left to reply
        result = await orch.run_turn("boss", f"@send {b} anyone?\n@send boss/b anyone?")
        assert result.messages_sent == []
        assert result.response.count("no live agent") == 2
        await orch.close()

    run(go())


# -- the user's inbox ---------------------------------------------------------------------


def test_user_inbox_is_peek_then_ack_and_durable(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        boss = await orch.create_root("boss")
        await orch.run_turn("boss", "@complete one\n@send user two\n@send parent three")
        first = orch.user_inbox()
        assert [(m.kind, m.payload, m.sender, m.recipient) for m in first] == [
            ("result", "one", boss.agent_id, USER),
            ("notification", "two", boss.agent_id, USER),
            ("notification", "three", boss.agent_id, USER),
        ]
        assert orch.user_inbox() == first  # peeking removes nothing
        assert orch.ack_user_messages([first[1].message_id, "not-a-message"]) == [
            first[1].message_id
        ]
        assert orch.ack_user_messages([first[1].message_id]) == []  # twice is a no-op
        await orch.close()

        orch = await Orchestrator.open(root)
        assert [m.message_id for m in orch.user_inbox()] == [
            first[0].message_id,
            first[2].message_id,
        ]
        assert [m.payload for m in await orch.collect_user_inbox()] == ["one", "three"]
        assert orch.user_inbox() == []
        await orch.close()

        orch = await Orchestrator.open(root)
        assert orch.user_inbox() == []
        user_log = read_log(root / "user" / "events.jsonl").entries
        assert [e["event"] for e in user_log] == [events.MESSAGE_ENQUEUED] * 3 + [
            events.MESSAGE_DELIVERED
        ] * 2
        assert all(e["endpoint"] == USER for e in user_log)
        await orch.close()

    run(go())


# -- notifications ---------------------------------------------------------------------


def test_subscribers_see_a_turn_and_a_broken_one_breaks_nothing(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        seen: list[str] = []
        times: list[str] = []

        def listen(kind: str, data: dict[str, Any]) -> None:
            seen.append(kind)
            times.append(data["time"])

        unsubscribe = orch.subscribe(listen)

        def broken(kind: str, data: dict[str, Any]) -> None:
            raise RuntimeError("subscriber bug")

        orch.subscribe(broken)
        await orch.create_root("boss")
        await orch.run_turn("boss", "@spawn a\n@send a hi")
        assert seen == [
            "agent.created",
            "turn.started",
            "turn.tool",
            "turn.tool",
            "agent.created",
            "message.enqueued",
            "turn.completed",
        ]
        assert times == sorted(times)  # every event carries when it happened
        unsubscribe()
        await orch.run_turn("boss", "quiet")
        assert len(seen) == 7
        await orch.close()

    run(go())


def test_the_agent_list_gives_each_path_from_its_parents_without_climbing_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(tmp_path / "root", registry=registry())
        await orch.create_root("lead")
        await orch.create_root("b2")
        await orch.run_turn("lead", "@spawn a10 x\n@spawn a2 y")
        await orch.run_turn("lead/a2", "@spawn deep z")
        await orch.run_turn("lead/a2/deep", "@spawn deeper z")
        expected = ["b2", "lead", "lead/a2", "lead/a2/deep", "lead/a2/deep/deeper", "lead/a10"]
        assert [info.path for info in orch.agents()] == expected
        assert [orch.get(info.agent_id).path for info in orch.agents()] == expected

        def climbed(*_: Any) -> str:
            raise AssertionError("a path climbed to the root for the list")

        # one listing of every agent: each path is its parent's and a name
        monkeypatch.setattr(orch.tree, "path", climbed)
        assert [info.path for info in orch.agents()] == expected
        monkeypatch.undo()
        await orch.close()

    run(go())
