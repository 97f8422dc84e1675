"""The newest sealed segments removed by hand: their entries are reported lost, and
neither their seqs nor their turn ids are handed out again.

Segment names say where the active file starts only while a sealed segment is
there; the log's start record (``events.start``) says it too. With the newest
segment removed and an empty active file, the segments left end earlier than
the record says: the entries between are lost (fsck: ``missing_segment``,
damage, for good), and the next entry and turn go on past them.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from substrat import fsck
from substrat.checkpointer import CheckpointPolicy
from substrat.checkpoints import CHECKPOINTS_DIR
from substrat.conversation import conversation_and_gaps
from substrat.eventlog import read_log
from substrat.orchestrator import Orchestrator
from substrat.segments import list_sealed
from tests.integration.test_checkpoints import agent_dirs, run
from tests.support.cli import SUBSTRAT
from tests.support.cli import run as cli

SEALING = CheckpointPolicy(every_entries=6, segment_bytes=600, compaction="keep")
"""Checkpoints often, seals small segments; a clean close seals the active file too."""


async def _turns(
    root: Path, prompts: list[str], policy: CheckpointPolicy = SEALING, compact: bool = False
) -> None:
    orch = await Orchestrator.open(root, checkpoints=policy)
    if not orch.tree.roots():
        await orch.create_root("solo", "You work alone.")
    for prompt in prompts:
        await orch.run_turn("solo", prompt)
    if compact:
        await orch.checkpoint()  # compacts: every segment a checkpoint covers is archived
    await orch.close()


def _turn_ids(path: Path) -> set[int]:
    text = path.read_text()
    return {int(n) for n in re.findall(r'"turn_id":"t(\d+)"', text)}


def test_a_removed_newest_segment_is_lost_and_its_ids_never_reused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run(_turns(root, [f"turn {i} " + "padding " * 20 for i in range(12)]))
    log = agent_dirs(root)["solo"] / "events.jsonl"
    assert log.stat().st_size == 0, "the clean close sealed the active file"
    newest = list_sealed(log)[-1]
    lost_turns = _turn_ids(newest.path)
    assert lost_turns, "the newest segment holds turns"
    newest.path.unlink()  # by hand

    found = [f for f in fsck.check(root).findings if f.kind == "missing_segment"]
    assert len(found) == 1, found
    assert found[0].severity == "damage"
    assert f"entries {newest.first}..{newest.last} are in no segment" in found[0].detail
    damage = read_log(log).damage
    assert "missing_segment" in damage.counts(), damage

    run(_turns(root, ["after the loss"]))
    entries = read_log(log).entries
    after = [e for e in entries if e["seq"] > newest.last]
    assert after and all(e["seq"] > newest.last for e in after)
    assert not [e for e in entries if newest.first <= e["seq"] <= newest.last]
    new_turns = {int(e["data"]["turn_id"][1:]) for e in after if e["event"] == "turn.start"}
    assert new_turns and min(new_turns) > max(lost_turns), (new_turns, lost_turns)
    # Reported for good: the next start's checkpoints do not paper over the loss.
    found = [f for f in fsck.check(root).findings if f.kind == "missing_segment"]
    assert len(found) == 1 and found[0].severity == "damage", found


def test_the_history_names_the_entries_lost_with_a_removed_segment(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run(_turns(root, [f"turn {i} " + "padding " * 20 for i in range(12)]))
    log = agent_dirs(root)["solo"] / "events.jsonl"
    sealed = list_sealed(log)
    assert len(sealed) >= 3
    middle, newest = sealed[1], sealed[-1]
    middle.path.unlink()
    newest.path.unlink()
    turns, gaps = conversation_and_gaps(log)
    assert gaps == [(middle.first, middle.last), (newest.first, newest.last)]
    assert turns  # what the other segments hold is still there


@pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")
def test_substrat_log_says_which_entries_are_missing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run(_turns(root, [f"turn {i} " + "padding " * 20 for i in range(12)]))
    newest = list_sealed(agent_dirs(root)["solo"] / "events.jsonl")[-1]
    newest.path.unlink()
    try:
        shown = cli(root, "log", "solo")
    finally:
        cli(root, "daemon", "stop")
    assert shown.returncode == 0, shown.stderr
    assert f"entries {newest.first}-{newest.last} of solo's log are missing" in shown.stdout


async def _unsealed_turns(root: Path, prompts: list[str]) -> None:
    orch = await Orchestrator.open(root, checkpoints=CheckpointPolicy())  # seals nothing here
    for prompt in prompts:
        await orch.run_turn("solo", prompt)
    await orch.close()


def test_a_segment_removed_before_a_written_active_file_stays_damage(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run(_turns(root, [f"turn {i} " + "padding " * 20 for i in range(12)]))
    run(_unsealed_turns(root, ["in the active file"]))
    log = agent_dirs(root)["solo"] / "events.jsonl"
    assert log.stat().st_size > 0
    newest = list_sealed(log)[-1]
    newest.path.unlink()
    for _ in range(2):  # before and after a start and a clean stop (new checkpoints)
        found = [f for f in fsck.check(root).findings if f.kind in ("missing_segment", "seq_gap")]
        assert [(f.kind, f.severity) for f in found] == [("missing_segment", "damage")], found
        run(_unsealed_turns(root, ["after"]))


ARCHIVING = CheckpointPolicy(every_entries=6, segment_bytes=600, compaction="archive")


async def _archived(root: Path, prompts: list[str]) -> None:
    await _turns(root, prompts, ARCHIVING, compact=True)


def test_a_cut_archive_holding_the_last_turns_never_gives_their_ids_again(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    run(_archived(root, [f"turn {i} " + "padding " * 20 for i in range(12)]))
    for _ in range(3):  # restarts without turns: the last turns' segment gets archived
        run(_archived(root, []))
    log = agent_dirs(root)["solo"] / "events.jsonl"
    entries = read_log(log).entries
    turns = [e for e in entries if e["event"] == "turn.start"]
    highest, at = int(turns[-1]["data"]["turn_id"][1:]), turns[-1]["seq"]
    (holder,) = [s for s in list_sealed(log) if s.first <= at <= s.last]
    assert holder.archived
    data = holder.path.read_bytes()
    holder.path.write_bytes(data[: len(data) // 3])  # its end lost: a failing disk
    shutil.rmtree(root / CHECKPOINTS_DIR)  # and nothing else says what it held
    assert read_log(log).damage.gaps()
    run(_archived(root, ["after the damage"]))
    after = [e for e in read_log(log).entries if e["event"] == "turn.start"]
    assert int(after[-1]["data"]["turn_id"][1:]) > highest, (after[-1]["data"], highest)
