"""The dry run (``fsck``, ``recover --dry-run``) knows a message was received as a start does.

A recipient's checkpoint keeps what it received in compact form (delivered
messages leave its pending inbox; the sender's turns already settled are a
number). A sender whose own checkpoint is older still lists the message among
its committed turn's effects. A real start asks the recipient's facts whether
they received it and rolls nothing forward; the dry run must ask the same way,
or fsck reports "effects of committed turns not applied" after an ordinary
``kill -9``, and ``--repair`` claims to fix what was never broken.
"""

from __future__ import annotations

from pathlib import Path

from oracle.kill import exit_without_close
from substrat import fsck, recovery
from substrat.checkpointer import CheckpointPolicy
from substrat.orchestrator import Orchestrator
from tests.integration.test_checkpoints import run, snapshot

MANUAL = CheckpointPolicy(on_evict=False, on_close=False, segment_bytes=256, compaction="delete")
"""Checkpoints only when the test asks (the default thresholds are far off); what a
checkpoint covers is deleted, so the dry run, like a start, must read from it."""


async def _sent_received_then_killed(root: Path) -> None:
    orch = await Orchestrator.open(root, checkpoints=MANUAL, slots=2)
    await orch.create_root("lead", "You coordinate.")
    await orch.run_turn("lead", "@spawn scout worker")
    await orch.checkpoint("lead")  # the sender's checkpoint: before it sends
    await orch.run_turn("lead", "@send scout map the ridge")
    await orch.run_turn("lead/scout", "@inbox")  # delivered
    await orch.checkpoint("lead/scout")  # the recipient's: after it received and read it
    await orch.run_turn("lead/scout", "mapping")
    await orch.checkpoint("lead/scout")  # ... and the segment that received it deleted
    exit_without_close(orch)  # kill -9: no clean shutdown's checkpoints


def test_a_message_the_recipients_checkpoint_settled_is_not_unreconciled(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run(_sent_received_then_killed(root))
    plan = recovery.analyze(root)
    lead = next(a for a in plan.agents if a.path == "lead")
    assert lead.to_reconcile == [], lead
    report = fsck.check(root)
    assert not [f for f in report.findings if f.kind == "unreconciled"], report.findings

    async def start() -> tuple[dict[str, object], list[str]]:
        orch = await Orchestrator.open(root, checkpoints=MANUAL)
        assert orch.recovery_report is not None
        reconciled = list(orch.recovery_report.reconciled)
        snap = snapshot(orch)
        exit_without_close(orch)
        return snap, reconciled

    snap, reconciled = run(start())
    assert reconciled == []  # the start agrees: nothing to roll forward
    assert snap["agents"]["lead/scout"]["inbox"] == []  # not delivered a second time
