"""A line removed whole from a log's middle: a ``seq`` gap, never a lost message.

A removed line leaves no damaged byte, only its missing number. With
checkpoints that matters: a sender's checkpoint forgets the messages its turns
sent once their recipients logged them, so when a recipient's ``message.enqueued``
line is then removed after the recipient's own checkpoint, only the sender's full
log still says the message was sent. Recovery must see the gap and read every log
from its start, as a restart without checkpoints would; fsck must report it. A log
that starts after entry 1 by design (segments deleted by the ``delete`` policy)
has no gap.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson

from substrat import fsck
from substrat.checkpointer import CheckpointPolicy
from substrat.checkpoints import CHECKPOINTS_DIR
from substrat.eventlog import read_log
from substrat.orchestrator import Orchestrator
from substrat.segments import list_sealed
from substrat.session.store import AGENTS_DIR
from tests.integration.test_checkpoints import (
    SMALL,
    _enqueued_lines,
    agent_dirs,
    build_root,
    from_the_logs,
    keep_a_checkpoint_before,
    reopen,
    run,
)

NO_ROLL = CheckpointPolicy(every_entries=SMALL.every_entries, segment_bytes=1 << 20)


def _two_messages_after_lead_checkpoint(tmp_path: Path) -> tuple[Path, Path, int, int]:
    """A root where a and b each sent lead one more message, every log checkpointed to
    its end (so a's checkpoint forgot its message), then lead's newest checkpoint lost
    (its older one, before both messages, holds): (root, file, offset, length) of a's
    message line in lead's log, which b's line follows."""
    root = build_root(tmp_path)

    async def two_more() -> None:
        orch = await Orchestrator.open(root, checkpoints=NO_ROLL, slots=1)
        await orch.run_turn("lead/a", "@send lead one more")
        await orch.run_turn("lead/b", "@send lead and another")
        await orch.close()

    run(two_more())
    lead = agent_dirs(root)["lead"]
    path, offset, length = _enqueued_lines(lead)[-2]
    assert path.name == "events.jsonl" and offset + length < path.stat().st_size
    keep_a_checkpoint_before(root, lead.name, offset)
    return root, path, offset, length


def _remove_line(path: Path, offset: int, length: int) -> str:
    """Remove the line whole (every byte left is healthy); returns its message id."""
    data = path.read_bytes()
    message_id = str(orjson.loads(data[offset : offset + length])["data"]["message_id"])
    path.write_bytes(data[:offset] + data[offset + length :])
    return message_id


def test_a_message_line_removed_whole_after_the_checkpoint_comes_back(tmp_path: Path) -> None:
    root, path, offset, length = _two_messages_after_lead_checkpoint(tmp_path)
    seq = orjson.loads(path.read_bytes()[offset : offset + length])["seq"]
    message_id = _remove_line(path, offset, length)
    want = from_the_logs(root, tmp_path)  # without checkpoints, a's log re-sends it
    assert message_id in str(want["agents"]["lead"]["inbox"])
    snap, report = reopen(root)
    assert snap == want
    assert read_log(path).damage.gaps() == [(seq, seq)]
    assert f"message:{message_id}" in report.reconciled
    assert report.log_gaps == {path.parent.name: [[seq, seq]]}
    assert f"entry {seq} is missing" in str(report.checkpoints_set_aside)
    assert report.checkpoints_used == 0
    assert report.to_dict()["log_gaps"] == {path.parent.name: [[seq, seq]]}


def test_fsck_reports_a_line_removed_whole_and_repair_brings_the_message_back(
    tmp_path: Path,
) -> None:
    root, path, offset, length = _two_messages_after_lead_checkpoint(tmp_path)
    seq = orjson.loads(path.read_bytes()[offset : offset + length])["seq"]
    message_id = _remove_line(path, offset, length)
    found = fsck.check(root)
    gaps = [f for f in found.findings if f.kind == "seq_gap"]
    assert len(gaps) == 1 and gaps[0].severity == fsck.DAMAGE, found.findings
    assert gaps[0].path == str(path.relative_to(root))
    assert f"entry {seq} is missing" in gaps[0].detail
    assert found.exit_code == fsck.EXIT_DAMAGE
    repaired = fsck.check(root, repair=True)
    assert repaired.recovery is not None
    assert f"message:{message_id}" in repaired.recovery["reconciled"]
    after = fsck.check(root)
    # the history keeps its hole; a checkpoint that agrees with the log now covers it
    assert after.problems == [], after.problems
    assert [f.severity for f in after.findings if f.kind == "seq_gap"] == [fsck.NOTICE]
    snap, report = reopen(root)
    assert report.checkpoints_set_aside is None and report.checkpoints_used > 0
    assert message_id in str(snap["agents"]["lead"]["inbox"])


def test_a_log_that_starts_after_entry_1_by_policy_has_no_gap(tmp_path: Path) -> None:
    """The ``delete`` policy removes a log's first segments: its history starts later,
    by design, and nothing reads that as entries missing."""
    policy = CheckpointPolicy(every_entries=4, segment_bytes=1500, compaction="delete")

    async def workload(root: Path) -> None:
        orch = await Orchestrator.open(root, checkpoints=policy, slots=1)
        await orch.create_root("lead", "You coordinate.")
        await orch.run_turn("lead", "@spawn a worker")
        for i in range(8):
            await orch.run_turn("lead", f"@ask a question {i}")
            await orch.run_pending()
        await orch.close()

    root = tmp_path / "root"
    run(workload(root))
    logs = sorted((root / AGENTS_DIR).glob("*/events.jsonl"))
    assert any(list_sealed(log) and list_sealed(log)[0].first > 1 for log in logs), (
        "the policy deleted some log's first segments"
    )
    for log in logs:
        assert read_log(log).damage.gaps() == []
    found = fsck.check(root)
    assert "seq_gap" not in found.kinds(include_notices=True), found.findings
    shutil.rmtree(root / CHECKPOINTS_DIR)  # every log read from where it starts
    _snap, report = reopen(root)
    assert report.log_gaps == {} and report.checkpoints_set_aside is None


def test_the_gap_fsck_repair_leaves_costs_no_later_start_a_full_read(tmp_path: Path) -> None:
    """``fsck --repair`` quarantines a damaged line from a log's middle: a gap in ``seq``
    on purpose. The checkpoints its recovery writes at its clean shutdown cover it, so
    fsck notes it and the next start reads from the checkpoints, not every log."""
    root, path, offset, length = _two_messages_after_lead_checkpoint(tmp_path)
    seq = orjson.loads(path.read_bytes()[offset : offset + length])["seq"]
    data = bytearray(path.read_bytes())
    data[offset + length // 2] ^= 0x01  # a's message line damaged, b's still after it
    path.write_bytes(bytes(data))
    assert fsck.check(root).kinds().get("damaged_line") == 1
    fsck.check(root, repair=True)
    assert read_log(path).damage.gaps() == [(seq, seq)]
    after = fsck.check(root)
    assert after.problems == [], after.problems
    assert [f.severity for f in after.findings if f.kind == "seq_gap"] == [fsck.NOTICE]
    _snap, report = reopen(root)
    assert report.checkpoints_set_aside is None and report.log_gaps == {}
    assert report.read_in_full == [] and report.checkpoints_used > 0
