"""Every query answers the same on a root started from the summary as on one started without.

A start from the start summary keeps a quiet agent's tree node, session record and
turn counters as the summary's row and builds them when first asked for
(:mod:`substrat.lazy`). Each test here starts the same root (the varied history of
``test_start_lazy``) twice, once from the summary and once with the summary removed,
and asks each fresh start one kind of question first, before anything else built what
it reads: the agent list, the daemon status's counts, the tree (roots, children,
paths, references by path and by id prefix), each agent's inspection and history,
the inboxes, which endpoints are quiet and what is settled. Then it stops both
cleanly and compares what ``fsck`` and ``compact --dry-run`` say of each root and
every byte a clean stop wrote. The start from the summary is checked to have left
nodes, records and counters unbuilt, so the questions are asked of the lazy state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oracle.kill import exit_without_close
from substrat import compaction, fsck, start_summary
from substrat.agents import USER
from substrat.daemon import Daemon, DaemonConfig
from substrat.lazy import LazyDict
from substrat.orchestrator import Orchestrator
from tests.integration.test_start_lazy import (
    POLICY,
    _counter,
    _files,
    _fixed_clock,
    _plain_in,
    build_root,
)


async def _quiet_leaves(root: Path) -> None:
    """Leaves that only took turns: quiet, so a start from the summary leaves them rows."""
    orch = await Orchestrator.open(root, checkpoints=POLICY, slots=2)
    await orch.run_turn("solo", "@spawn q1 worker\n@spawn q2 worker\n@spawn q3 worker")
    for name in ("q1", "q2"):
        await orch.run_turn(f"solo/{name}", "a turn of its own")
    await orch.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_root(tmp_path_factory.mktemp("lazy-queries"))
    asyncio.run(_quiet_leaves(root))
    return root


def _copies(root: Path, where: Path) -> tuple[Path, Path]:
    """Two copies of the root, each stopped cleanly once (a copy's summary is stale: its
    files are new inodes), one of them then without its summary."""
    lazy, eager = where / "lazy", where / "eager"
    for copy in (lazy, eager):
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(root, copy)
        _stopped_at_once(copy)
    os.unlink(start_summary.summary_path(eager))
    return lazy, eager


def _unbuilt(orch: Orchestrator) -> dict[str, int]:
    counts = {"nodes": orch.tree.unbuilt()}
    for name in ("sessions", "turn_counts", "settled_turns", "last_complete_seq"):
        held = getattr(orch, name)
        counts[name] = held.unbuilt() if isinstance(held, LazyDict) else 0
    return counts


def _ask(root: Path, question: Callable[[Orchestrator], Any]) -> tuple[Any, dict[str, int]]:
    """``question`` asked of a fresh start of ``root`` first (the start not closed)."""

    async def go() -> tuple[Any, dict[str, int]]:
        orch = await Orchestrator.open(root, checkpoints=POLICY)
        try:
            unbuilt = _unbuilt(orch)
            return _plain_in(question(orch), orch.root), unbuilt
        finally:
            exit_without_close(orch)

    return asyncio.run(go())


PATHS = ["lead", "lead/a", "lead/b", "lead/a/deep", "solo", "solo/q1", "solo/q2", "solo/q3"]


def _agents(orch: Orchestrator) -> Any:
    return [info.to_dict() for info in orch.agents(include_terminated=True)]


def _status_counts(orch: Orchestrator) -> Any:
    """The daemon's status (what ping and the heartbeat ask: counted, nothing built)."""
    daemon = Daemon(DaemonConfig(root=orch.root))
    daemon.orch = orch
    unbuilt = orch.tree.unbuilt()
    status = daemon.status()
    assert orch.tree.unbuilt() == unbuilt  # nothing built to count
    counts = {key: status[key] for key in ("agents", "roots", "busy_turns", "checkpoints")}
    counts.update(
        tree=len(orch.tree),
        sessions=len(orch.sessions),
        turn_counts=len(orch.turn_counts),
        report_agents=orch.recovery_report.agents if orch.recovery_report else None,
    )
    agents = orch.agents()  # the listing the counts stand for
    assert status["agents"] == len(agents)
    assert status["roots"] == sum(1 for a in agents if a.parent_id is None)
    return counts


def _tree(orch: Orchestrator) -> Any:
    tree = orch.tree
    roots = [n.agent_id for n in tree.roots()]
    first = roots[0]
    return {
        "roots": roots,
        "children": {r: [dataclasses.asdict(c) for c in tree.children(r)] for r in roots},
        "paths": tree.paths(),
        "by_path": {p: tree.resolve(p).agent_id for p in tree.paths()},
        "by_prefix": tree.resolve(first[:8]).agent_id,
        "view": orch.tree_view(),
    }


def _one_by_one(orch: Orchestrator) -> Any:
    """Each agent asked for by path, never by a question that goes over them all."""
    return {p: orch.inspect(p) for p in PATHS}


def _histories(orch: Orchestrator) -> Any:
    return {p: [dataclasses.asdict(t) for t in orch.history(p)] for p in PATHS}


def _inboxes(orch: Orchestrator) -> Any:
    return {
        "user": [m.to_dict() for m in orch.user_inbox()],
        "agents": {
            e: [m.to_dict() for m in orch.inboxes.inbox(e).all()]
            for e in sorted(orch.inboxes.endpoints())
        },
    }


def _quiet_and_settled(orch: Orchestrator) -> Any:
    sessions = [USER, *(orch.tree.resolve(p).session_id for p in ("lead", "lead/b", "solo"))]
    return {
        "quiet": {s: orch.quiet(s) for s in sessions},
        "settled": dict(sorted(orch.settled().turns.items())),
        "counters": {
            p: (
                orch.turn_counts.get(orch.tree.resolve(p).agent_id),
                orch.settled_turns.get(orch.tree.resolve(p).agent_id),
                orch.last_complete_seq.get(orch.tree.resolve(p).agent_id),
            )
            for p in ("lead/a/deep", "lead/b", "solo/q1", "solo/q3")
        },
    }


QUESTIONS = {
    "agent list": _agents,
    "status counts": _status_counts,
    "tree": _tree,
    "inspect": _one_by_one,
    "history": _histories,
    "inboxes": _inboxes,
    "quiet and settled": _quiet_and_settled,
}


@pytest.mark.parametrize("name", sorted(QUESTIONS))
def test_a_question_asked_first_answers_the_same(built: Path, tmp_path: Path, name: str) -> None:
    lazy, eager = _copies(built, tmp_path)
    got, unbuilt = _ask(lazy, QUESTIONS[name])
    want, none = _ask(eager, QUESTIONS[name])
    assert got == want
    # the start from the summary had them unbuilt when the question came, the other not
    assert min(unbuilt.values()) >= 3, unbuilt  # deep, q1, q2, q3 (lead and solo: roots)
    assert not any(none.values()), none


def _stopped_at_once(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(
            root, checkpoints=POLICY, clock=_fixed_clock, new_id=_counter()
        )
        await orch.close()

    asyncio.run(go())


def test_a_clean_stop_right_after_the_start_writes_the_same(built: Path, tmp_path: Path) -> None:
    """Nothing asked: the stop builds what it writes. The same records, logs and
    checkpoints, and ``fsck`` and ``compact --dry-run`` say the same of both roots."""
    lazy, eager = _copies(built, tmp_path)
    _stopped_at_once(lazy)
    _stopped_at_once(eager)
    got, want = _files(lazy), _files(eager)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name
    for root in (lazy, eager):
        assert os.path.exists(start_summary.summary_path(root))  # each stop wrote one

    def findings(root: Path) -> Any:
        return sorted((f.severity, f.kind, f.path, f.detail) for f in fsck.check(root).findings)

    assert findings(lazy) == findings(eager)
    planned = [compaction.plan(root).to_dict() for root in (lazy, eager)]
    assert _plain_in(planned[0], lazy) == _plain_in(planned[1], eager)
