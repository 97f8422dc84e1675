"""Recovery is idempotent: twice, or crashed halfway and rerun, it ends in the same state.

Also: a reply stranded in the replier's log reaches the asker exactly once, a
terminated agent stays terminated over any number of restarts, and the user's
log is repaired before recovery reads it.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import shutil
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from substrat import events, persistence, recovery
from substrat.agents import USER
from substrat.eventlog import EventLog, read_log
from substrat.orchestrator import Orchestrator
from substrat.session import Session, SessionState, SessionStore
from tests.support.kill import abandon

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Crash(BaseException):
    """A simulated kill."""


class Ids:
    """Deterministic session-shaped ids with a per-world hex prefix (so worlds can merge)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.counter = itertools.count(1)
        self.ticks = itertools.count(1)

    def new_id(self) -> str:
        return f"{self.prefix}{next(self.counter):0{32 - len(self.prefix)}x}"

    def clock(self) -> str:
        return f"2030-01-01T00:00:{next(self.ticks) % 60:02d}.000000+00:00"


async def open_root(root: Path, ids: Ids | None = None, slots: int = 2) -> Orchestrator:
    if ids is None:  # random ids and the real clock
        return await Orchestrator.open(root, slots=slots)
    return await Orchestrator.open(root, slots=slots, new_id=ids.new_id, clock=ids.clock)


def snapshot(orch: Orchestrator) -> dict[str, Any]:
    orch.tree.check()
    out: dict[str, Any] = {}
    for info in orch.agents():
        out[info.path] = (
            info.agent_id,
            info.parent_id,
            info.state.value,
            [(m.message_id, m.kind, m.payload) for m in orch.inboxes.inbox(info.agent_id).all()],
            [(t.turn_id, t.prompt, t.response) for t in orch.history(info.agent_id)],
        )
    out[USER] = [(m.message_id, m.kind, m.payload) for m in orch.user_inbox()]
    return out


def disk(root: Path) -> dict[str, str]:
    """Digest of every durable file (the pending WAL is scratch space and left out)."""
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != "events.pending" and not path.name.endswith(".tmp"):
            files[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def states(root: Path) -> dict[str, SessionState]:
    return {s.session_id: s.state for s in SessionStore(root).scan(quarantine=False).sessions}


def patch_writes(monkeypatch: pytest.MonkeyPatch, crash_at: int, when: str) -> list[str]:
    """Count log appends and record writes; raise Crash at the ``crash_at``-th (1-based)."""
    seen: list[str] = []
    original_log, original_save = EventLog.log, SessionStore.save

    def hit(label: str) -> bool:
        seen.append(label)
        return len(seen) == crash_at

    def log(self: EventLog, event: str, data: Any = None) -> int:
        if hit(f"log {event}"):
            if when == "after":
                original_log(self, event, data)
            raise Crash(event)
        return original_log(self, event, data)

    def save(self: SessionStore, session: Session) -> None:
        if hit(f"save {session.state.value}"):
            if when == "after":
                original_save(self, session)
            raise Crash("save")
        original_save(self, session)

    monkeypatch.setattr(EventLog, "log", log)
    monkeypatch.setattr(SessionStore, "save", save)
    return seen


# -- a root with a lot for recovery to do ------------------------------------------


async def _crash_after(orch: Orchestrator, event: str, nth: int, coro: Any) -> None:
    """Run ``coro``; the ``nth`` append of ``event`` is the last thing that happens."""
    original = EventLog.log
    count = 0

    def log(self: EventLog, name: str, data: Any = None) -> int:
        nonlocal count
        seq = original(self, name, data)
        if name == event:
            count += 1
            if count == nth:
                raise Crash(name)
        return seq

    EventLog.log = log  # type: ignore[method-assign]
    try:
        await coro
    except Crash:
        pass
    else:
        raise AssertionError("the crash point was not reached")
    finally:
        EventLog.log = original  # type: ignore[method-assign]
        abandon(orch)


async def _world_turn_cut_short(root: Path) -> None:
    """boss's committed turn spawns, messages, terminates; the crash cuts every effect."""
    orch = await open_root(root, Ids("a"))
    await orch.create_root("boss")
    await orch.run_turn("boss", "@spawn a\n@spawn b")
    await orch.run_turn("boss", "@send b @spawn b1")
    await orch.run_pending()
    await orch.run_turn("boss", "@ask a question one")
    await _crash_after(
        orch,
        events.TURN_COMPLETE,
        1,
        orch.run_turn(
            "boss",
            "@spawn c\n@send c welcome\n@send a hello\n@complete done\n@terminate b",
        ),
    )


async def _world_cascade_cut_short(root: Path) -> None:
    orch = await open_root(root, Ids("b"))
    await orch.create_root("zed")
    await orch.run_turn("zed", "@spawn z1\n@spawn z2")
    await _crash_after(orch, events.AGENT_TERMINATED, 1, orch.terminate("zed", cascade=True))


async def _world_orphan(root: Path) -> None:
    orch = await open_root(root, Ids("c"))
    await _crash_after(orch, events.SESSION_CREATED, 1, orch.create_root("late"))


def build_messy_root(tmp_path: Path) -> Path:
    """Three crashed roots merged into one (their ids cannot collide)."""
    base = tmp_path / "messy"
    run(_world_turn_cut_short(base))
    for name, world in (("cascade", _world_cascade_cut_short), ("orphan", _world_orphan)):
        other = tmp_path / name
        run(world(other))
        for session_dir in (other / "agents").iterdir():
            shutil.copytree(session_dir, base / "agents" / session_dir.name)
    return base


def test_recovering_twice_changes_nothing_the_second_time(tmp_path: Path) -> None:
    base = build_messy_root(tmp_path)

    async def twice() -> None:
        first = await open_root(base)
        report = first.recovery_report
        assert report is not None
        assert report.reconciled and report.cascaded and report.orphans_terminated
        assert any(r.startswith("spawn:") for r in report.reconciled)
        assert any(r.startswith("terminate:") for r in report.reconciled)
        snap, files = snapshot(first), disk(base)
        abandon(first)
        second = await open_root(base)
        again = second.recovery_report
        assert again is not None
        assert again.reconciled == [] and again.cascaded == []
        assert again.orphans_terminated == [] and again.records_rebuilt == []
        assert snapshot(second) == snap
        assert disk(base) == files  # not one byte written the second time
        abandon(second)

    run(twice())


def _clean_recovery(tmp_path: Path, base: Path) -> tuple[dict[str, Any], int]:
    copy = tmp_path / "clean"
    shutil.copytree(base, copy)
    seen: list[str] = []
    original_log, original_save = EventLog.log, SessionStore.save

    def log(self: EventLog, event: str, data: Any = None) -> int:
        seen.append(event)
        return original_log(self, event, data)

    def save(self: SessionStore, session: Session) -> None:
        seen.append("save")
        original_save(self, session)

    async def go() -> dict[str, Any]:
        orch = await open_root(copy)
        snap = snapshot(orch)
        abandon(orch)
        return snap

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(EventLog, "log", log)
        mp.setattr(SessionStore, "save", save)
        snap = run(go())
    return snap, len(seen)


def test_crash_at_every_write_of_recovery_then_recover_again(tmp_path: Path) -> None:
    base = build_messy_root(tmp_path)
    expected, writes = _clean_recovery(tmp_path, base)
    assert writes >= 15, "the messy root must give recovery plenty to write"
    for k in range(1, writes + 1):
        for when in ("before", "after"):
            root = tmp_path / f"r{k}{when}"
            shutil.copytree(base, root)
            with pytest.MonkeyPatch.context() as mp:
                seen = patch_writes(mp, k, when)
                held: list[Orchestrator] = []

                async def crashing(root: Path = root, held: list[Orchestrator] = held) -> None:
                    orch = Orchestrator(root, slots=2)  # what open() does, keeping hold
                    held.append(orch)
                    orch.recover()

                with pytest.raises(Crash):
                    run(crashing())
                abandon(held[0])
                assert len(seen) == k

            async def reopen(root: Path = root) -> dict[str, Any]:
                orch = await open_root(root)
                snap = snapshot(orch)
                abandon(orch)
                return snap

            assert run(reopen()) == expected, f"crash {when} write {k} ({seen[-1]})"
            assert SessionState.ACTIVE not in states(root).values()


# -- specific guarantees ---------------------------------------------------------


def test_reply_stranded_in_the_repliers_log_reaches_the_asker_once(tmp_path: Path) -> None:
    root = tmp_path / "root"

    async def strand() -> tuple[str, str]:
        orch = await open_root(root)
        await orch.create_root("boss")
        await orch.run_turn("boss", "@spawn a\n@spawn b\n@send a @ask b are you there")
        assert await orch.run_pending(max_turns=1) == 1  # a asks b
        a = orch.tree.resolve("boss/a")
        (request_id,) = a.waiting_on
        await _crash_after(orch, events.TURN_COMPLETE, 1, orch.run_pending(max_turns=1))
        return a.agent_id, request_id

    a_id, request_id = run(strand())
    replies = [
        (entry, message)
        for session_dir in (root / "agents").iterdir()
        for entry in read_log(session_dir / "events.jsonl").entries
        if entry["event"] == events.TURN_COMPLETE
        for message in entry["data"]["effects"]["messages"]
        if message["kind"] == "reply"
    ]
    ((b_log, reply),) = replies
    assert reply["reply_to"] == request_id and reply["recipient"] == a_id

    def enqueued_in_a(orch: Orchestrator) -> list[str]:
        path = orch.logs.path(orch.tree.get(a_id).session_id)
        return [
            e["data"]["message_id"]
            for e in read_log(path).entries
            if e["event"] == events.MESSAGE_ENQUEUED
        ]

    async def recover_twice_then_consume() -> None:
        orch = await open_root(root)
        assert orch.recovery_report is not None
        assert f"message:{reply['message_id']}" in orch.recovery_report.reconciled
        (got,) = orch.inboxes.inbox(a_id).all()
        assert got.message_id == reply["message_id"] and got.reply_to == request_id
        assert got.payload == b_log["data"]["response"]
        assert orch.tree.get(a_id).waiting_on == {}  # the reply is here: a waits no more
        abandon(orch)
        orch = await open_root(root)  # a second recovery must not add a second copy
        assert [m.message_id for m in orch.inboxes.inbox(a_id).all()] == [reply["message_id"]]
        assert enqueued_in_a(orch).count(reply["message_id"]) == 1
        assert await orch.run_pending() == 1
        last = orch.history(a_id)[-1]
        assert reply["message_id"] in last.prompt
        await orch.close()
        orch = await open_root(root)
        assert orch.inboxes.inbox(a_id).all() == []
        assert enqueued_in_a(orch).count(reply["message_id"]) == 1
        assert await orch.run_pending() == 0
        await orch.close()

    run(recover_twice_then_consume())


def test_terminated_child_stays_terminated_across_restarts(tmp_path: Path) -> None:
    root = tmp_path / "root"

    async def go() -> None:
        orch = await open_root(root)
        await orch.create_root("boss")
        await orch.run_turn("boss", "@spawn a\n@spawn b")
        old_b = orch.get("boss/b").agent_id
        await orch.terminate("boss/b")
        await orch.run_turn("boss", "@terminate a")
        await orch.close()
        for _ in range(2):
            orch = await open_root(root)
            assert [i.path for i in orch.agents()] == ["boss"]
            assert orch.recovery_report is not None
            assert orch.recovery_report.reconciled == []
            await orch.close()
        # a new child with a terminated one's name must not clash with a ghost
        orch = await open_root(root)
        await orch.run_turn("boss", "@spawn b reborn")
        new_b = orch.get("boss/b").agent_id
        assert new_b != old_b
        await orch.close()
        orch = await open_root(root)
        assert [i.path for i in orch.agents()] == ["boss", "boss/b"]
        assert orch.get("boss/b").agent_id == new_b
        assert sorted(s.value for s in states(root).values()) == [
            "created",  # the new b has not run a turn yet
            "suspended",
            "terminated",
            "terminated",
        ]
        await orch.close()

    run(go())


def _ended(orch: Orchestrator) -> dict[str, str | None]:
    """Each terminated agent's name and when it ended, as ``agent list --all`` shows it."""
    return {
        i.name: i.terminated_at
        for i in orch.agents(include_terminated=True)
        if i.state.value == "terminated"
    }


@pytest.mark.parametrize("cut_short", [False, True], ids=["whole", "cut short by a crash"])
def test_every_agent_of_a_cascade_keeps_when_it_ended_across_restarts(
    tmp_path: Path, cut_short: bool
) -> None:
    """A cascade writes ``agent.terminated`` into every descendant's own log (or recovery
    does, for a cascade a crash cut short): that entry is where ``agent list --all`` and
    "agent X was terminated at ..." read the time from once the daemon restarted."""
    root = tmp_path / "root"

    async def go() -> None:
        if cut_short:
            await _world_cascade_cut_short(root)
        else:
            orch = await open_root(root)
            await orch.create_root("zed")
            await orch.run_turn("zed", "@spawn z1\n@spawn z2")
            await orch.terminate("zed", cascade=True)
            await orch.close()
        for _ in range(2):
            orch = await open_root(root)
            ended = _ended(orch)
            assert sorted(ended) == ["z1", "z2", "zed"], ended
            assert all(ended.values()), f"a terminated agent lost when it ended: {ended}"
            await orch.close()

    run(go())


def test_user_log_is_repaired_before_recovery_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ack cut between its WAL write and its append must not flip later.

    Recovery decides the cut ack did not happen (the message is still pending).
    If the user's log were read before it was opened (opening replays the WAL),
    the ack would reappear at the next write to that log, and a later restart
    would lose a message the recovered daemon had shown as pending.
    """
    root = tmp_path / "root"

    async def setup() -> None:
        orch = await open_root(root)
        await orch.create_root("boss")
        await orch.run_turn("boss", "@complete first result")
        (message,) = orch.user_inbox()
        real_write_all = persistence.write_all

        def write_all(fd: int, data: bytes) -> None:
            if b'"endpoint":"user"' in data and b"message.delivered" in data:
                raise Crash("cut between the WAL and the append")
            real_write_all(fd, data)

        monkeypatch.setattr(persistence, "write_all", write_all)
        with pytest.raises(Crash):
            orch.ack_user_messages([message.message_id])
        monkeypatch.setattr(persistence, "write_all", real_write_all)
        abandon(orch)

    run(setup())

    async def after() -> None:
        orch = await open_root(root)
        pending = [m.message_id for m in orch.user_inbox()]
        await orch.run_turn("boss", "@complete second result")  # writes the user's log
        assert [m.message_id for m in orch.user_inbox()][: len(pending)] == pending
        snap = snapshot(orch)
        await orch.close()
        orch = await open_root(root)
        assert snapshot(orch) == snap
        await orch.close()

    run(after())


def _all_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_analyze_writes_nothing_and_predicts_what_recovery_does(tmp_path: Path) -> None:
    base = build_messy_root(tmp_path)
    before = _all_bytes(base)
    plan = recovery.analyze(base)
    assert _all_bytes(base) == before  # read-only: not even a pending file is touched

    async def recover_now() -> tuple[set[str], recovery.RecoveryReport]:
        orch = await open_root(base)
        live = {i.name for i in orch.agents()}
        assert orch.recovery_report is not None
        report = orch.recovery_report
        abandon(orch)
        return live, report

    live, report = run(recover_now())
    assert live == {"boss", "a", "c"}
    predicted = {a.name for a in plan.agents if a.status in ("live", "record to rebuild")}
    predicted |= {
        r[len("spawn ") :] for a in plan.agents for r in a.to_reconcile if r.startswith("spawn ")
    }
    assert predicted == live
    statuses = {a.name: a.status for a in plan.agents if a.name is not None}
    assert statuses["b"] == statuses["b1"] == "will be terminated (a committed turn ordered it)"
    assert statuses["z1"] == statuses["z2"] == "will be terminated (an ancestor was terminated)"
    assert statuses["zed"] == "terminated"
    orphans = {a.session_id for a in plan.agents if a.status.startswith("orphan")}
    assert orphans == set(report.orphans_terminated)
    (boss_plan,) = [a for a in plan.agents if a.name == "boss"]
    assert "terminate b" in boss_plan.to_reconcile and "spawn c" in boss_plan.to_reconcile
    predicted_messages = {m for a in plan.agents for m in a.to_reconcile if " " not in m}
    rolled = {r.split(":", 1)[1] for r in report.reconciled if r.startswith("message:")}
    assert predicted_messages == rolled and rolled
    assert all(a.lost_turn is None for a in plan.agents)
