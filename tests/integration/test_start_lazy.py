"""A start from the summary holds what a start without it holds, for every agent, field by field.

A start that takes quiet agents from the start summary (:mod:`substrat.start_summary`)
builds less at start: an agent's checkpoint is built when the checkpointer first
asks for it (:meth:`~substrat.checkpointer.Checkpointer.adopt`), the roll-forward
plan looks only at agents with something to plan. After varied histories (children,
requests and replies, results, messages to the user and their acks, a terminated
agent, messages left unread, a turn lost to a crash, a turn after the summary), this
compares everything an orchestrator holds of every agent between a start that takes
them from the summary and one that reads the store's lines without it (the summary
removed): every field of every tree node, record, inbox message and checkpoint (all of
them built), the turn counters, settled turns, last completed seqs, and where each
log ends. A quiet agent's node, record and counters are kept as its summary row and
built when first asked for (:mod:`substrat.lazy`): the comparison builds them all
(``test_start_lazy_queries`` asks each question of a start before anything is
built). Without any checkpoint store the same holds but for the checkpoints.

The comparison goes over each dataclass's fields as declared, so a field added later is
compared too; :func:`test_the_comparison_sees_every_field` shows that changing any
one field of any one object makes the states differ.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oracle.kill import abandon, exit_without_close
from substrat import start_summary
from substrat.agents import USER
from substrat.checkpointer import CheckpointPolicy
from substrat.checkpoints import CHECKPOINTS_DIR
from substrat.errors import AgentNotFoundError
from substrat.eventlog import Resume
from substrat.lazy import LazyDict
from substrat.orchestrator import Orchestrator

POLICY = CheckpointPolicy(every_entries=4)
"""Checkpoints every few entries, no segment sealed: every agent can be in the summary."""


async def _history(root: Path) -> None:
    orch = await Orchestrator.open(root, checkpoints=POLICY, slots=2)
    await orch.create_root("lead", "You coordinate.")
    await orch.create_root("solo", "You work alone.")
    await orch.run_turn("lead", "@spawn a worker\n@spawn b worker\n@spawn c doomed")
    for i in range(2):
        await orch.run_turn("lead", f"@ask a question {i}\n@send b note {i}")
        await orch.run_pending()
        await orch.run_turn("lead/a", f"@complete result {i}\n@send user hello {i}")
        await orch.run_turn("lead/b", f"@ask lead what next {i}")
    await orch.run_turn("lead/a", "@spawn deep helper")
    await orch.run_turn("lead/a/deep", "@send user from deep")
    orch.ack_user_messages([m.message_id for m in orch.user_inbox()][:1])
    await orch.run_turn("lead", "@terminate c")
    await orch.run_turn("solo", "@send lead left unread")  # lead's inbox keeps it
    await orch.run_turn("solo", "a turn of its own")
    await orch.close()


async def _after_the_summary(root: Path) -> None:
    """One agent's turn after the clean stop, then a kill (the start retired the summary:
    put back, its entry is passed over, as for a log appended to by hand)."""
    orch = await Orchestrator.open(root, checkpoints=CheckpointPolicy.off(), slots=1)
    await orch.run_turn("solo", "one more turn")
    abandon(orch)


def build_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    asyncio.run(_history(root))
    summary = Path(start_summary.summary_path(root))
    kept = summary.read_bytes()
    asyncio.run(_after_the_summary(root))
    assert not summary.exists()  # that start retired it before its first write
    summary.write_bytes(kept)  # the store is the same: solo's log alone is not as it says
    return root


def _plain_in(value: Any, root: Path) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain_in(getattr(value, f.name), root) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return (type(value).__name__, value.value)
    if isinstance(value, dict):
        return {k: _plain_in(v, root) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_in(v, root) for v in value]
    if isinstance(value, Path):  # the same file of each copy of the root
        return ("path", os.fspath(value.relative_to(root)))
    return value


def state(orch: Orchestrator, *, checkpoints: bool = True) -> dict[str, Any]:
    """Everything the orchestrator holds of every agent (see the module docstring)."""
    sessions = sorted(node.session_id for node in orch.tree.nodes())
    root = orch.root

    def _plain(value: Any) -> Any:
        return _plain_in(value, root)

    held: dict[str, Any] = {
        "nodes": {node.session_id: _plain(node) for node in orch.tree.nodes()},
        "paths": _paths(orch),
        "sessions": {sid: _plain(orch.sessions[sid]) for sid in sorted(orch.sessions)},
        "turn_counts": dict(sorted(orch.turn_counts.items())),
        "settled_turns": dict(sorted(orch.settled_turns.items())),
        "last_complete_seq": dict(sorted(orch.last_complete_seq.items())),
        "inboxes": {
            endpoint: [_plain(m) for m in orch.inboxes.inbox(endpoint).all()]
            for endpoint in sorted(orch.inboxes.endpoints())
        },
        "ends": {e: _end(orch.logs.end(e)) for e in [USER, *sessions]},
    }
    if checkpoints:
        kept = orch.checkpointer._all_kept()  # every one built, as the eager start has them
        held["checkpoints"] = {e: _plain(kept[e]) for e in sorted(kept)}
    return held


def _end(resume: Resume | None) -> tuple[int, int] | None:
    """Where a log ends; not whether the summary gave it (``Resume.summarized``: a start
    from the summary says so, one without it cannot)."""
    return None if resume is None else (resume.offset, resume.last_seq)


def _paths(orch: Orchestrator) -> list[str] | str:
    try:
        return sorted(orch.tree.paths())
    except (AgentNotFoundError, KeyError) as exc:  # a node the test below changed: broken
        return str(exc)


def opened(root: Path) -> tuple[Orchestrator, Any]:
    async def go() -> tuple[Orchestrator, Any]:
        orch = await Orchestrator.open(root, checkpoints=POLICY)
        exit_without_close(orch)  # no clean shutdown: it would write a new summary
        return orch, orch.recovery_report

    return asyncio.run(go())


def _copy(root: Path, name: str) -> Path:
    copy = root.parent / name
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(root, copy)
    return copy


@pytest.fixture(scope="module")
def starts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Orchestrator, ...]:
    """The same root started three ways: from the summary, without it, without a store."""
    root = build_root(tmp_path_factory.mktemp("lazy"))
    no_summary = _copy(root, "no-summary")
    os.unlink(start_summary.summary_path(no_summary))
    no_store = _copy(root, "no-store")
    shutil.rmtree(no_store / CHECKPOINTS_DIR)
    lazy, report = opened(root)
    assert report.start_summary is None
    assert report.summary_used == len(lazy.tree) - 1 and len(report.summary_passed_over) == 1
    # a quiet agent's node, record and counters are its row until first asked for
    assert lazy.tree.unbuilt() > 0
    for held in (lazy.sessions, lazy.turn_counts, lazy.settled_turns, lazy.last_complete_seq):
        assert isinstance(held, LazyDict) and held.unbuilt() > 0
    eager, report = opened(no_summary)
    assert report.summary_used == 0 and report.checkpoints_used == len(lazy.tree) + 1
    plain, report = opened(no_store)
    assert report.checkpoints_used == 0
    return lazy, eager, plain


def test_a_start_from_the_summary_holds_what_one_without_it_holds(
    starts: tuple[Orchestrator, ...],
) -> None:
    lazy, eager, plain = starts
    assert len(lazy.tree) == 5  # lead, lead/a, lead/b, lead/a/deep, solo (lead/c terminated)
    want = state(eager)
    got = state(lazy)
    for part in want:
        assert got[part] == want[part], part
    assert want["inboxes"][USER] and any(  # the comparison has unread messages in it
        messages for endpoint, messages in want["inboxes"].items() if endpoint != USER
    )
    assert state(lazy, checkpoints=False) == state(plain, checkpoints=False)


def _objects(orch: Orchestrator) -> Iterator[tuple[str, Any]]:
    """One object of every kind the comparison holds, to change a field of."""
    node = next(n for n in orch.tree.nodes() if n.parent_id is not None)
    yield "node", node
    yield "session", orch.sessions[node.session_id]
    message = next(m for e in orch.inboxes.endpoints() for m in orch.inboxes.inbox(e).all())
    yield "message", message
    checkpoint = orch.checkpointer._all_kept()[node.session_id][-1]
    yield "checkpoint", checkpoint
    assert checkpoint.stored is not None
    yield "checkpoint.at", checkpoint.at
    yield "checkpoint.stored", checkpoint.stored


def _other(value: Any) -> Any:
    """A value of the same type as ``value``, not equal to it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, enum.Enum):
        return next(member for member in type(value) if member is not value)
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "~"
    if isinstance(value, bytes):
        return value + b"~"
    if isinstance(value, dict):
        return {**value, "~": "~"}
    if isinstance(value, Path):
        return value / "~"
    return "~" if value is None else None  # a dataclass too: its fields are changed below


def test_the_comparison_sees_every_field(starts: tuple[Orchestrator, ...]) -> None:
    lazy, eager, _ = starts
    want = state(eager)
    assert state(lazy) == want
    changed = []
    for kind, obj in _objects(lazy):
        for f in dataclasses.fields(obj):
            before = getattr(obj, f.name)
            object.__setattr__(obj, f.name, _other(before))  # frozen ones too
            try:
                if state(lazy) != want:
                    changed.append(f"{kind}.{f.name}")
            finally:
                object.__setattr__(obj, f.name, before)
    every = [f"{kind}.{f.name}" for kind, obj in _objects(lazy) for f in dataclasses.fields(obj)]
    assert changed == every
    for counters in (lazy.turn_counts, lazy.settled_turns, lazy.last_complete_seq):
        agent = next(iter(counters))
        counters[agent] += 1
        assert state(lazy) != want
        counters[agent] -= 1
    sid = next(iter(lazy.sessions))
    end = lazy.logs._ends[sid]
    lazy.logs._ends[sid] = dataclasses.replace(end, offset=end.offset + 1)
    assert state(lazy) != want
    lazy.logs._ends[sid] = end
    assert state(lazy) == want


def _fixed_clock() -> str:
    return "2030-01-01T00:00:00.000000Z"


def _counter() -> Any:
    numbers = iter(range(1 << 30))
    return lambda: f"{next(numbers):032x}"


async def _first_use(root: Path) -> None:
    """A quiet agent's turn (a message to another), then a checkpoint of every log."""
    orch = await Orchestrator.open(
        root, checkpoints=POLICY, slots=1, clock=_fixed_clock, new_id=_counter()
    )
    await orch.run_turn("lead/b", "@send lead/a after the start")
    await orch.run_turn("lead/a/deep", "a turn of its own")
    await orch.checkpoint()
    await orch.close()


def _files(root: Path) -> dict[str, bytes]:
    return {
        os.fspath(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name not in ("start.json", "daemon.log", "lock")
    }


def test_an_agent_first_used_after_a_start_from_the_summary_writes_the_same_bytes(
    tmp_path: Path,
) -> None:
    """Its checkpoint, built when the checkpointer first asks for it, is the one the
    start without the summary built: every log, record and checkpoint written after
    it (a turn, a message, a checkpoint of every log, a clean stop) is the same."""
    root = build_root(tmp_path)
    no_summary = _copy(root, "no-summary")
    os.unlink(start_summary.summary_path(no_summary))
    asyncio.run(_first_use(root))
    asyncio.run(_first_use(no_summary))
    got, want = _files(root), _files(no_summary)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name
