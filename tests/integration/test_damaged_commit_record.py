"""A turn whose ``turn.complete`` line is damaged: recovery must not say it did not happen.

The commit record is the line that says a turn completed; once it is durable
the turn's effects are applied (here: a message in another agent's log). If
that line is damaged afterwards, the log shows the turn started and never
ended, which is also what a crash mid-turn leaves. Recovery closes it either
way (a damaged line costs that line), but it must not tell the agent that none
of its tool calls took effect: a damaged line follows the start, so the turn
may have completed.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from substrat import events, recovery
from substrat.checkpointer import CheckpointPolicy
from substrat.checkpoints import CHECKPOINTS_DIR
from substrat.eventlog import read_log
from substrat.orchestrator import Orchestrator
from substrat.recovery import lost_turn_notice
from substrat.restore import LOST_IN_FLIGHT, OUTCOME_UNKNOWN
from tests.integration.test_checkpoints import agent_dirs, run

OFF = CheckpointPolicy.off()


async def _build(root: Path) -> None:
    orch = await Orchestrator.open(root, checkpoints=OFF)
    await orch.create_root("lead", "You coordinate.")
    await orch.run_turn("lead", "@spawn scout worker")
    await orch.run_turn("lead", "Effectful.\n@send scout map the ridge")
    await orch.close()


def _damage_the_last_commit(log: Path) -> None:
    lines = log.read_bytes().splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if b'"turn.complete"' in line)
    lines[last] = lines[last].replace(b"digest", b"DIGEST", 1)  # same length, bad CRC
    log.write_bytes(b"".join(lines))


def test_a_damaged_commit_record_makes_the_outcome_unknown_not_lost(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run(_build(root))
    log = agent_dirs(root)["lead"] / "events.jsonl"
    _damage_the_last_commit(log)
    shutil.rmtree(root / CHECKPOINTS_DIR, ignore_errors=True)  # read the log, not a summary

    plan = recovery.analyze(root)
    lost = next(a for a in plan.agents if a.path == "lead").lost_turn
    assert lost is not None and lost["turn_id"] == "t2" and lost.get("record_damaged"), lost
    notice = lost_turn_notice(lost)
    assert "may have completed" in notice and "none of its tool calls" not in notice

    async def start() -> None:
        orch = await Orchestrator.open(root, checkpoints=OFF)
        await orch.close()

    run(start())
    failed = [e for e in read_log(log).entries if e["event"] == events.TURN_FAILED]
    assert [e["data"]["error"] for e in failed] == [OUTCOME_UNKNOWN], failed
    assert OUTCOME_UNKNOWN != LOST_IN_FLIGHT


def test_a_turn_cut_with_no_damage_after_it_is_lost_in_flight(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run(_build(root))
    log = agent_dirs(root)["lead"] / "events.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if b'"turn.complete"' in line)
    log.write_bytes(b"".join(lines[:last]))  # a crash before the commit: nothing after it
    shutil.rmtree(root / CHECKPOINTS_DIR, ignore_errors=True)
    lost = next(a for a in recovery.analyze(root).agents if a.path == "lead").lost_turn
    assert lost is not None and not lost.get("record_damaged")
    assert "none of its tool calls took effect" in lost_turn_notice(lost)


def _lead_told(root: Path) -> dict[str, Any] | None:
    """What a start has to tell lead of its lost turn (``AgentNode.lost_turn``)."""

    async def start() -> dict[str, Any] | None:
        orch = await Orchestrator.open(root, checkpoints=OFF)
        try:
            return next(n for n in orch.tree.nodes() if n.name == "lead").lost_turn
        finally:
            await orch.close()

    return run(start())


def test_the_doubt_outlives_the_close_and_a_second_start(tmp_path: Path) -> None:
    """The start closes the turn as "outcome unknown"; the next start, before the agent ran
    again, must tell it the same, not that the turn was lost in flight."""
    root = tmp_path / "root"
    run(_build(root))
    _damage_the_last_commit(agent_dirs(root)["lead"] / "events.jsonl")
    shutil.rmtree(root / CHECKPOINTS_DIR, ignore_errors=True)

    first = _lead_told(root)
    second = _lead_told(root)
    assert first is not None and first.get("record_damaged"), first
    assert second is not None and second["turn_id"] == "t2" and second.get("record_damaged"), second
    assert "may have completed" in lost_turn_notice(second)


def test_fsck_repair_keeps_the_doubt_of_the_lines_it_quarantines(tmp_path: Path) -> None:
    """``fsck --repair`` moves the damaged commit line to quarantine/: the turn must still be
    closed as "outcome unknown" (the line may have been its turn.complete) and reported."""
    from substrat.fsck import check as fsck

    root = tmp_path / "root"
    run(_build(root))
    log = agent_dirs(root)["lead"] / "events.jsonl"
    _damage_the_last_commit(log)

    report = fsck(root, repair=True)
    failed = [e["data"] for e in read_log(log).entries if e["event"] == events.TURN_FAILED]
    closes = [(d["turn_id"], d["error"]) for d in failed if not d.get("reserved")]
    assert closes == [("t2", OUTCOME_UNKNOWN)], failed
    assert report.recovery is not None
    lost = report.recovery.get("lost_turns", [])
    assert [(t["turn_id"], t.get("record_damaged")) for t in lost] == [("t2", True)], lost

    told = _lead_told(root)
    assert told is not None and told.get("record_damaged"), told
    assert "none of its tool calls" not in lost_turn_notice(told)


def test_a_repair_cut_short_before_its_rewrite_keeps_the_doubt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The close is written before the damaged line leaves the log: a repair that dies
    between the two (here: the rewrite fails, as a kill at that point would leave it)
    leaves the note, and the next repair finishes without closing the turn twice."""
    from substrat import fsck_repair, persistence
    from substrat.fsck import check as fsck

    root = tmp_path / "root"
    run(_build(root))
    log = agent_dirs(root)["lead"] / "events.jsonl"
    _damage_the_last_commit(log)
    real_write = persistence.atomic_write

    class Killed(BaseException):
        pass

    def killed_at_the_rewrite(path: Path, data: bytes) -> None:
        if Path(path) == log:
            raise Killed
        real_write(path, data)

    monkeypatch.setattr(fsck_repair.persistence, "atomic_write", killed_at_the_rewrite)
    with pytest.raises(Killed):
        fsck(root, repair=True)
    monkeypatch.undo()

    def closes() -> list[tuple[str, str]]:
        failed = [e["data"] for e in read_log(log).entries if e["event"] == events.TURN_FAILED]
        return [(d["turn_id"], d["error"]) for d in failed if not d.get("reserved")]

    assert closes() == [("t2", OUTCOME_UNKNOWN)]
    fsck(root, repair=True)
    assert closes() == [("t2", OUTCOME_UNKNOWN)]
    told = _lead_told(root)
    assert told is not None and told.get("record_damaged"), told
