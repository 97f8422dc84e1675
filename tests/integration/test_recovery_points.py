"""Crash at each of the seed's seven injection points, recover from real files, compare.

Each case runs the same workload twice with deterministic ids and clocks:

* a reference world, which never crashes, gives the state before and after
  the operation under test;
* a crash world, where a :class:`Crash` (a ``BaseException``, so no handler
  in substrat catches it, as no handler runs after a kill) is raised at the
  injection point; the orchestrator is then abandoned with its files open and
  the root is reopened.

The recovered tree, inboxes (the user's too), agent states and conversations
must equal the reference's state before the operation or after it, never a
mix; which of the two is fixed by the commit points (``agent.created`` for
``create_root`` and spawns, ``turn.complete`` for turns, the target's
``agent.terminated`` for terminations). On disk no record may stay ACTIVE and
every terminated agent's record must say TERMINATED.

Where the outcome is "after", both worlds then keep going (``run_pending``)
and must stay equal, which shows that what recovery rolled forward is a fully
working state (waiting flags, provider conversations), not a look-alike.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from substrat import events
from substrat.agents import USER
from substrat.eventlog import EventLog
from substrat.orchestrator import Orchestrator
from substrat.session import Session, SessionState, SessionStore
from tests.support.kill import abandon

T = TypeVar("T")
SLOTS = 1  # one live session: every turn of another agent evicts, so restores happen too


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Crash(BaseException):
    """A simulated kill at an injection point."""


@dataclass
class World:
    """A root plus the deterministic id and clock sources of its orchestrators."""

    root: Path

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._ticks = itertools.count(1)

    def new_id(self) -> str:
        return f"{next(self._ids):032x}"

    def clock(self) -> str:
        tick = next(self._ticks)
        return f"2030-01-01T{tick // 3_600_000_000:02d}:00:00.{tick % 1_000_000:06d}+00:00"

    async def open(self) -> Orchestrator:
        return await Orchestrator.open(self.root, slots=SLOTS, new_id=self.new_id, clock=self.clock)


@dataclass
class Trap:
    """Raise :class:`Crash` once, ``when`` the ``nth`` matching call happens."""

    target: str  # "log" (EventLog.log) or "save" (SessionStore.save)
    when: str  # "before" or "after" the original call
    event: str | None = None
    match: Callable[[dict[str, Any]], bool] | None = None
    nth: int = 1
    armed: bool = False
    seen: int = 0
    fired: bool = False

    def hit(self, event: str | None, data: dict[str, Any]) -> bool:
        if not self.armed or (self.event is not None and event != self.event):
            return False
        if self.match is not None and not self.match(data):
            return False
        self.seen += 1
        if self.seen < self.nth:
            return False
        self.armed, self.fired = False, True
        return True


def install(monkeypatch: pytest.MonkeyPatch, trap: Trap) -> None:
    original_log = EventLog.log
    original_save = SessionStore.save

    def log(self: EventLog, event: str, data: Any = None) -> int:
        if trap.target == "log" and trap.hit(event, dict(data or {})):
            if trap.when == "before":
                raise Crash(f"before logging {event}")
            original_log(self, event, data)
            raise Crash(f"after logging {event}")
        return original_log(self, event, data)

    def save(self: SessionStore, session: Session) -> None:
        if trap.target == "save" and trap.hit(None, {"state": session.state.value}):
            if trap.when == "before":
                raise Crash("before writing the session record")
            original_save(self, session)
            raise Crash("after writing the session record")
        original_save(self, session)

    monkeypatch.setattr(EventLog, "log", log)
    monkeypatch.setattr(SessionStore, "save", save)


def snapshot(orch: Orchestrator) -> dict[str, Any]:
    """Everything acknowledged state is judged on, keyed by path (ids are deterministic)."""
    orch.tree.check()

    def box(endpoint: str) -> list[tuple[Any, ...]]:
        return [
            (m.message_id, m.sender, m.kind, m.payload, m.reply_to)
            for m in orch.inboxes.inbox(endpoint).all()
        ]

    agents = {}
    for info in orch.agents():
        agents[info.path] = {
            "agent_id": info.agent_id,
            "session_id": info.session_id,
            "parent": info.parent_id,
            "state": info.state.value,
            "inbox": box(info.agent_id),
            "history": [(t.turn_id, t.prompt, t.response) for t in orch.history(info.agent_id)],
            "waiting_on": dict(orch.tree.get(info.agent_id).waiting_on),
        }
    return {"agents": agents, "user": box(USER)}


def disk_states(root: Path) -> dict[str, SessionState]:
    scan = SessionStore(root).scan(quarantine=False)
    assert not scan.quarantined
    return {s.session_id: s.state for s in scan.sessions}


def check_disk(orch: Orchestrator) -> None:
    states = disk_states(orch.root)
    assert SessionState.ACTIVE not in states.values(), states
    live = {info.session_id for info in orch.agents()}
    for sid, state in states.items():
        if sid in live:
            assert state is not SessionState.TERMINATED, sid
        else:  # terminated agents and orphans of an unacknowledged create
            assert state is SessionState.TERMINATED, (sid, state)
    assert live <= states.keys()


# -- workloads -----------------------------------------------------------------

Op = Callable[[Orchestrator], Awaitable[Any]]


async def family(orch: Orchestrator) -> None:
    """A root ``boss`` with two children ``a`` and ``b``."""
    await orch.create_root("boss", "you lead")
    await orch.run_turn("boss", "@spawn a first worker\n@spawn b second worker")


async def boss_asks_a(orch: Orchestrator) -> None:
    await family(orch)
    await orch.run_turn("boss", "@ask a what is two plus two")


async def a_asks_b(orch: Orchestrator) -> None:
    """``a`` sends ``b`` a request (child to child), via a notification from boss."""
    await family(orch)
    await orch.run_turn("boss", "@send a @ask b ping from a")
    assert await orch.run_pending(max_turns=1) == 1  # a's turn sends the request to b


async def wake_one(orch: Orchestrator) -> None:
    assert await orch.run_pending(max_turns=1) == 1


async def busy_turn(orch: Orchestrator) -> None:
    await orch.run_turn(
        "boss",
        "@spawn c third worker\n@send a hello a\n@broadcast all hands\n@complete report",
    )


@dataclass
class Case:
    name: str
    prefix: Op
    op: Op
    trap: Trap
    outcome: str  # "before" or "after": the state recovery must give back
    lost_turn: str | None = None  # the path of the agent whose turn is lost


def is_reply(data: dict[str, Any]) -> bool:
    return data.get("kind") == "reply"


def is_new_record(data: dict[str, Any]) -> bool:
    return data.get("state") == SessionState.CREATED.value


CASES = [
    # 1. after the provider's create(), before the session record is written
    Case(
        "1-root-before-record",
        family,
        lambda o: o.create_root("late"),
        Trap("save", "before", match=is_new_record),
        "before",
    ),
    Case(
        "1-child-before-record",
        family,
        lambda o: o.run_turn("boss", "@spawn c late child"),
        Trap("save", "before", match=is_new_record),
        "after",  # the spawn is part of a committed turn: rolled forward
    ),
    # 2. after the session record, before agent.created
    Case(
        "2-root-after-record",
        family,
        lambda o: o.create_root("late"),
        Trap("save", "after", match=is_new_record),
        "before",
    ),
    Case(
        "2-root-after-session-created",
        family,
        lambda o: o.create_root("late"),
        Trap("log", "before", events.AGENT_CREATED),
        "before",
    ),
    Case(
        "2-child-after-record",
        family,
        lambda o: o.run_turn("boss", "@spawn c late child"),
        Trap("log", "before", events.AGENT_CREATED),
        "after",
    ),
    # 3. after agent.created, before the call returns
    Case(
        "3-root-after-created",
        family,
        lambda o: o.create_root("late"),
        Trap("log", "after", events.AGENT_CREATED),
        "after",
    ),
    Case(
        "3-child-after-created",
        family,
        lambda o: o.run_turn("boss", "@spawn c late child\n@send c welcome"),
        Trap("log", "after", events.AGENT_CREATED),
        "after",
    ),
    # 4. after send() returned, before the response is logged
    Case(
        "4-root-turn-with-effects",
        family,
        busy_turn,
        Trap("log", "before", events.TURN_COMPLETE),
        "before",
        lost_turn="boss",
    ),
    Case(
        "4-woken-child-with-request",
        a_asks_b,
        wake_one,
        Trap("log", "before", events.TURN_COMPLETE),
        "before",
        lost_turn="boss/b",
    ),
    # 5. after the response is logged, before the reply is delivered
    Case(
        "5-reply-to-parent",
        boss_asks_a,
        wake_one,
        Trap("log", "after", events.TURN_COMPLETE),
        "after",
    ),
    Case(
        "5-reply-to-sibling",
        a_asks_b,
        wake_one,
        Trap("log", "after", events.TURN_COMPLETE),
        "after",
    ),
    Case(
        "5-root-turn-with-effects",
        family,
        busy_turn,
        Trap("log", "after", events.TURN_COMPLETE),
        "after",
    ),
    # 6. after the message is enqueued, before its delivery is logged
    Case(
        "6-reply-enqueued",
        a_asks_b,
        wake_one,
        Trap("log", "after", events.MESSAGE_ENQUEUED, is_reply),
        "after",
    ),
    Case(
        "6-before-delivered",
        boss_asks_a,
        wake_one,
        Trap("log", "before", events.MESSAGE_DELIVERED),
        "after",
    ),
    Case(
        "6-first-of-several-enqueued",
        family,
        busy_turn,
        Trap("log", "after", events.MESSAGE_ENQUEUED),
        "after",
    ),
    # 7. after agent.terminated, before the agent leaves the tree
    Case(
        "7-leaf",
        boss_asks_a,
        lambda o: o.terminate("boss/b"),
        Trap("log", "after", events.AGENT_TERMINATED),
        "after",
    ),
    Case(
        "7-leaf-not-yet-logged",
        boss_asks_a,
        lambda o: o.terminate("boss/b"),
        Trap("log", "before", events.AGENT_TERMINATED),
        "before",
    ),
    Case(
        "7-cascade-after-target",
        boss_asks_a,
        lambda o: o.terminate("boss", cascade=True),
        Trap("log", "after", events.AGENT_TERMINATED),
        "after",
    ),
    Case(
        "7-cascade-after-first-leaf",
        boss_asks_a,
        lambda o: o.terminate("boss", cascade=True),
        Trap("log", "after", events.AGENT_TERMINATED, nth=2),
        "after",
    ),
    Case(
        "7-child-terminated-by-parent-turn",
        boss_asks_a,
        lambda o: o.run_turn("boss", "@terminate b"),
        Trap("log", "after", events.AGENT_TERMINATED),
        "after",
    ),
    # the user's inbox: crash between the durable ack and the in-memory removal
    Case(
        "user-ack",
        lambda o: _with_user_mail(o),
        lambda o: o.collect_user_inbox(),
        Trap("log", "after", events.MESSAGE_DELIVERED),
        "after",
    ),
]


async def _with_user_mail(orch: Orchestrator) -> None:
    await family(orch)
    await orch.run_turn("boss", "@complete first\n@send user second")


async def reference(world: World, case: Case) -> tuple[dict[str, Any], ...]:
    orch = await world.open()
    await case.prefix(orch)
    before = snapshot(orch)
    await case.op(orch)
    after = snapshot(orch)
    await orch.run_pending()
    continued = snapshot(orch)
    await orch.close()
    return before, after, continued


async def crash(world: World, case: Case, trap: Trap, held: list[Orchestrator]) -> None:
    orch = await world.open()
    held.append(orch)
    await case.prefix(orch)
    trap.armed = True
    await case.op(orch)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_crash_at_injection_point_recovers_all_or_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: Case
) -> None:
    before, after, continued = run(reference(World(tmp_path / "ref"), case))
    assert before != after, "the operation under test must change something"

    world = World(tmp_path / "crash")
    trap = case.trap
    trap.armed, trap.seen, trap.fired = False, 0, False
    install(monkeypatch, trap)
    held: list[Orchestrator] = []
    with pytest.raises(Crash):
        run(crash(world, case, trap, held))
    assert trap.fired
    abandon(held[0])

    async def recover_and_continue() -> None:
        orch = await world.open()
        report = orch.recovery_report
        assert report is not None
        recovered = snapshot(orch)
        expected = before if case.outcome == "before" else after
        assert recovered == expected
        check_disk(orch)
        lost = [orch.tree.path(t["agent_id"]) for t in report.lost_turns]
        assert lost == ([case.lost_turn] if case.lost_turn else [])
        await orch.run_pending()
        if case.outcome == "after":
            assert snapshot(orch) == continued
        else:
            drained = snapshot(orch)
            assert all(not a["inbox"] for a in drained["agents"].values())
            if case.lost_turn is not None:
                turns = drained["agents"][case.lost_turn]["history"]
                if case.lost_turn == "boss":  # a root resumes only when asked to
                    assert len(turns) == len(before["agents"]["boss"]["history"])
                else:  # a woken child gets its messages again, with the notice
                    assert "was lost in flight" in turns[-1][1]
        await orch.close()

    run(recover_and_continue())


def test_root_that_lost_a_turn_resumes_with_a_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = World(tmp_path / "w")
    trap = Trap("log", "before", events.TURN_COMPLETE)
    install(monkeypatch, trap)
    held: list[Orchestrator] = []
    case = Case("resume", family, busy_turn, trap, "before")
    with pytest.raises(Crash):
        run(crash(world, case, trap, held))
    abandon(held[0])

    async def resume() -> None:
        orch = await world.open()
        node = orch.tree.resolve("boss")
        assert node.lost_turn is not None and node.lost_turn["turn_id"] == "t2"
        assert "@spawn c third worker" in node.lost_turn["prompt"]
        results = await orch.resume_roots()
        assert [r.agent_id for r in results] == [node.agent_id]
        last = orch.history("boss")[-1]
        assert last.turn_id == "t3"  # t2 was started and lost: its id is not reused
        assert "was lost in flight" in last.prompt and last.prompt.endswith(
            "Continue where you left off."
        )
        assert node.lost_turn is None
        assert await orch.resume_roots() == []  # once only
        # none of the lost turn's tool calls took effect
        assert [c.name for c in orch.tree.children(node.agent_id)] == ["a", "b"]
        assert orch.user_inbox() == []
        await orch.close()

    run(resume())
