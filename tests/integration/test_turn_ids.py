"""Turn ids are never handed out twice, and no committed turn vanishes, whatever line is damaged.

A multi-turn log (completed turns, a failed one, an eviction, a turn cut by a
kill) is damaged one line at a time, with a flipped byte that makes the line's
checksum fail. After each: the root opens, every turn whose ``turn.complete``
is intact is in the history with its prompt and response (and in the
conversation the provider is restored from), and the next turn gets an id
above every id the log ever handed out; ``fsck`` says what it found, and after
``fsck --repair`` the same holds.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from substrat import events, fsck
from substrat.conversation import conversation_from_log
from substrat.errors import ProviderError
from substrat.eventlog import EventLog, encode_entry, read_log
from substrat.orchestrator import Orchestrator
from substrat.providers.base import AgentContext, TurnRecord
from substrat.providers.registry import ProviderRegistry
from substrat.providers.scripted import ScriptedProvider
from tests.support.kill import abandon

T = TypeVar("T")


def turn_number(turn_id: object) -> int | None:
    text = str(turn_id)
    return int(text[1:]) if text.startswith("t") and text[1:].isdigit() else None


class Kill(BaseException):
    """Stops the process dead: nothing in substrat catches it."""


def script(prompt: str, turns: list[TurnRecord], ctx: AgentContext) -> str:
    if prompt.endswith("FAIL"):
        raise ProviderError("the provider failed")
    if prompt.endswith("KILL"):
        raise Kill()
    return f"answer to {prompt!r} after {len(turns)} turns"


def registry() -> ProviderRegistry:
    reg = ProviderRegistry()
    reg.register("scripted", ScriptedProvider(script))
    return reg


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@dataclass
class Built:
    root: Path
    log: Path
    history: list[tuple[str, str, str]]  # (turn_id, prompt, response) of committed turns
    handed_out: int  # the highest turn number the log ever named


async def _build(root: Path, *, recovered: bool) -> Built:
    orch = await Orchestrator.open(root, registry=registry(), slots=1)
    await orch.create_root("ada", "be brief")
    await orch.run_turn("ada", "hello")
    with pytest.raises(ProviderError):
        await orch.run_turn("ada", "please FAIL")
    await orch.run_turn("ada", "again")
    await orch.evict("ada")
    await orch.run_turn("ada", "more")
    sid = orch.get("ada").session_id
    with pytest.raises(Kill):
        await orch.run_turn("ada", "then KILL")
    abandon(orch)  # the kill closed the descriptors; nothing else ran
    if recovered:  # the lost turn is closed in the log, and the log goes on
        orch = await Orchestrator.open(root, registry=registry(), slots=1)
        await orch.close()
    path = orch.logs.path(sid)
    entries = read_log(path).entries
    history = [(t.turn_id, t.prompt, t.response) for t in conversation_from_log(path)]
    handed_out = max(
        turn_number(e["data"].get("turn_id")) or 0
        for e in entries
        if e["event"] in (events.TURN_START, events.TURN_COMPLETE, events.TURN_FAILED)
    )
    return Built(root, path, history, handed_out)


@pytest.fixture(scope="module", params=["killed", "recovered"])
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp(request.param) / "root"
    root.mkdir()
    b = run(_build(root, recovered=request.param == "recovered"))
    assert [t[0] for t in b.history] == ["t1", "t3", "t4"] and b.handed_out == 5
    return b


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _damage(path: Path, index: int) -> dict[str, Any]:
    """Flip one byte inside line ``index`` (its checksum then fails); returns the entry."""
    lines = _lines(path)
    line = bytearray(lines[index])
    entry = read_log(path).entries[index]
    at = line.index(b'"data":') + 2  # inside the data: the line stays JSON-shaped
    line[at] ^= 0x01
    lines[index] = bytes(line)
    path.write_bytes(b"".join(lines))
    assert read_log(path).damage.counts() == {"bad_checksum": 1}
    return entry


def _copy(b: Built, to: Path) -> Path:
    shutil.copytree(b.root, to)
    return to / b.log.relative_to(b.root)


async def _after(root: Path) -> tuple[list[tuple[str, str, str]], str, str]:
    """History, the next turn's id and its response, on the recovered root."""
    orch = await Orchestrator.open(root, registry=registry(), slots=1)
    try:
        history = [(t.turn_id, t.prompt, t.response) for t in orch.history("ada")]
        await orch.evict("ada")  # the next turn restores the provider from the log
        result = await orch.run_turn("ada", "next")
        return history, result.turn_id, result.response
    finally:
        await orch.close()


def _expected(b: Built, damaged: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Every committed turn but the one whose own commit record was damaged."""
    if damaged["event"] == events.TURN_COMPLETE:
        return [t for t in b.history if t[0] != damaged["data"]["turn_id"]]
    return list(b.history)


def _check(b: Built, damaged: dict[str, Any], root: Path) -> None:
    history, turn_id, response = run(_after(root))
    what = f"after damage to {damaged['event']} {damaged['data'].get('turn_id', '')}"
    assert history == _expected(b, damaged), what
    number = turn_number(turn_id)
    assert number is not None and number > b.handed_out, f"{turn_id} handed out twice {what}"
    # the provider was restored with every committed turn, prompts included
    assert response.startswith(f"#{len(history) + 1} "), what
    assert f"after {len(history)} turns" in response, what
    ids = [t.turn_id for t in run(_history(root))]
    assert len(ids) == len(set(ids)), f"two turns share an id {what}: {ids}"


async def _history(root: Path) -> list[TurnRecord]:
    orch = await Orchestrator.open(root, registry=registry(), slots=1)
    try:
        return orch.history("ada")
    finally:
        await orch.close()


def test_every_line_damaged_in_turn(built: Built, tmp_path: Path) -> None:
    count = len(_lines(built.log))
    assert count >= 12
    for index in range(count):
        log = _copy(built, tmp_path / f"line{index}")
        damaged = _damage(log, index)
        _check(built, damaged, tmp_path / f"line{index}")


def test_every_line_damaged_in_turn_then_fsck_repair(built: Built, tmp_path: Path) -> None:
    """fsck reports the damage (and a committed turn without its start); --repair leaves a
    clean root on which ids are still never reused (a reserved id stands in for a
    quarantined line that may have been a turn's start)."""
    for index in range(len(_lines(built.log))):
        root = tmp_path / f"line{index}"
        log = _copy(built, root)
        damaged = _damage(log, index)
        report = fsck.check(root)
        assert report.kinds()["damaged_line"] == 1
        headless = damaged["event"] == events.TURN_START and any(
            t[0] == damaged["data"]["turn_id"] for t in built.history
        )
        notices = report.kinds(include_notices=True)
        assert notices.get("turn_start_lost", 0) == (1 if headless else 0), notices
        repaired = fsck.check(root, repair=True)
        assert all(f.repaired for f in repaired.problems), repaired.problems
        again = fsck.check(root)
        assert again.exit_code == 0, again.findings
        _check(built, damaged, root)


@pytest.mark.parametrize("built", ["killed"], indirect=True)
def test_fsck_repair_reserves_the_id_of_a_dropped_turn_start(built: Built, tmp_path: Path) -> None:
    """A turn in flight whose start is followed by another entry of its own (a provider's
    note, logged during the turn) and nothing else names it: when that start line is
    damaged, ``fsck --repair`` drops it and logs a reserved ``turn.failed`` for its id,
    so the next turn gets a new one."""
    root = tmp_path / "root"
    log = _copy(built, root)
    in_flight = len(_lines(log)) - 1
    assert read_log(log).entries[in_flight]["event"] == events.TURN_START
    with EventLog(log, {"session_id": log.parent.name}) as appended:
        appended.log(events.PROVIDER_SESSION, {"provider": "scripted", "reason": "new"})
    damaged = _damage(log, in_flight)
    repaired = fsck.check(root, repair=True)
    assert all(f.repaired for f in repaired.problems), repaired.problems
    _check(built, damaged, root)


def _damage_last_line_after_power_loss(built: Built, root: Path) -> dict[str, Any]:
    """A copy of the killed root whose unsynced pending copy a power loss took, with its
    log's last line then damaged; returns that line's entry."""
    log = _copy(built, root)
    log.with_name("events.pending").unlink(missing_ok=True)
    return _damage(log, len(_lines(log)) - 1)


@pytest.mark.parametrize("built", ["killed"], indirect=True)
def test_fsck_repair_reserves_the_id_of_a_dropped_last_line_without_a_pending_copy(
    built: Built, tmp_path: Path
) -> None:
    """The log's last line is damaged and no pending copy is left to restore it (the copy
    is not fsynced: a power loss after the kill may take it). That line may have been the
    start of a turn already handed out, so ``fsck --repair`` drops it and logs a reserved
    ``turn.failed`` for its id: the next turn gets a new one."""
    root = tmp_path / "root"
    damaged = _damage_last_line_after_power_loss(built, root)
    repaired = fsck.check(root, repair=True)
    assert all(f.repaired for f in repaired.problems), repaired.problems
    _check(built, damaged, root)


@pytest.mark.parametrize("built", ["killed"], indirect=True)
def test_a_damaged_last_turn_start_without_a_pending_copy_keeps_its_id(
    built: Built, tmp_path: Path
) -> None:
    """The kill left the in-flight turn's start as the log's last line; a power loss took
    the unsynced pending copy, and the line is then damaged. Opening the root cuts that
    line off the end, yet the turn is closed as lost in flight, durably: its id is not
    handed out again, at this start or the next."""
    root = tmp_path / "root"
    damaged = _damage_last_line_after_power_loss(built, root)
    assert damaged["event"] == events.TURN_START
    orch = run(Orchestrator.open(root, registry=registry(), slots=1))
    report = orch.recovery_report
    run(orch.close())
    assert report is not None
    assert [t["turn_id"] for t in report.lost_turns] == [damaged["data"]["turn_id"]]
    _check(built, damaged, root)  # a second start: the id stays taken


def test_a_committed_turn_with_a_damaged_start_is_in_every_view(
    built: Built, tmp_path: Path
) -> None:
    """The history, the conversation the provider gets, and `substrat log`'s source."""
    root = tmp_path / "root"
    log = _copy(built, root)
    index = next(
        i
        for i, e in enumerate(read_log(log).entries)
        if e["event"] == events.TURN_START and e["data"]["turn_id"] == "t3"
    )
    _damage(log, index)
    assert [t.turn_id for t in conversation_from_log(log)] == ["t1", "t3", "t4"]
    history, turn_id, _ = run(_after(root))
    assert [h[0] for h in history] == ["t1", "t3", "t4"] and history[1][1] == "again"
    assert turn_id == "t6"


def test_a_turn_from_before_turn_complete_carried_the_prompt(root: Path) -> None:
    """An older log: turn.complete without the prompt, turn.start damaged. The turn stays
    (empty prompt), and fsck reports the lost prompt as damage it cannot repair."""
    sid = "ab" * 16
    agent = "cd" * 16
    context = {"session_id": sid, "ts": "2026-01-01T00:00:00+00:00"}
    rows = [
        (events.SESSION_CREATED, {"provider": "scripted", "model": "directives"}),
        (events.AGENT_CREATED, {"agent_id": agent, "name": "old", "parent_session_id": None}),
        (events.TURN_START, {"turn_id": "t1", "prompt": "hi"}),
        (events.TURN_COMPLETE, {"turn_id": "t1", "response": "#1 x", "transcript": []}),
    ]
    lines = [
        encode_entry({"seq": i + 1, **context, "event": ev, "data": data})
        for i, (ev, data) in enumerate(rows)
    ]
    lines[2] = lines[2].replace(b'"hi"', b'"hj"')
    (root / "agents" / sid).mkdir(parents=True)
    (root / "agents" / sid / "events.jsonl").write_bytes(b"".join(lines))
    found = [t.turn_id for t in conversation_from_log(root / "agents" / sid / "events.jsonl")]
    assert found == ["t1"]
    repaired = fsck.check(root, repair=True)
    assert repaired.kinds().get("turn_prompt_lost") == 1
    left = fsck.check(root)
    assert left.kinds() == {"turn_prompt_lost": 1} and left.exit_code == 1
