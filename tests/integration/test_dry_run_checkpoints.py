"""``recover --dry-run`` says what a real start does, checkpoints included.

A log whose first segments were removed by hand is read by a start from a
checkpoint of it that holds; with none, the start holds its agent back
(nothing says what those segments held). The dry run (``recovery.analyze``)
must say the same, on the same disk, without writing anything.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from oracle.kill import exit_without_close
from substrat import recovery
from substrat.checkpoints import CHECKPOINTS_DIR
from substrat.orchestrator import Orchestrator
from substrat.segments import list_sealed
from tests.integration.test_checkpoints import SMALL, agent_dirs, build_root, run


def _dry_run(root: Path) -> tuple[set[str], set[str]]:
    """(live agents' session ids, held agents' session ids) as the dry run says."""
    plan = recovery.analyze(root)
    live = {a.session_id for a in plan.agents if a.status == "live"}
    return live, {u.session_id for u in plan.unreadable}


def _start(root: Path) -> tuple[set[str], set[str]]:
    """The same, as a real start finds it (no clean shutdown: nothing new written)."""

    async def go() -> tuple[set[str], set[str]]:
        orch = await Orchestrator.open(root, checkpoints=SMALL)
        report = orch.recovery_report
        assert report is not None
        live = {node.session_id for node in orch.tree.nodes()}
        exit_without_close(orch)
        return live, {u.session_id for u in report.unreadable}

    return run(go())


def test_the_dry_run_holds_back_a_log_without_its_history_as_a_start_does(
    tmp_path: Path,
) -> None:
    root = build_root(tmp_path)
    lead = agent_dirs(root)["lead"]
    healthy = _dry_run(root)
    assert lead.name in healthy[0] and healthy[1] == set()
    list_sealed(lead / "events.jsonl")[0].path.unlink()  # removed by hand
    # the checkpoints still hold: both read lead from its checkpoint, live
    live, held = _dry_run(root)
    assert (live, held) == healthy == _start(root)
    shutil.rmtree(root / CHECKPOINTS_DIR)  # now nothing says what that segment held
    live, held = _dry_run(root)
    assert lead.name in held and lead.name not in live
    assert (live, held) == _start(root)
    (item,) = [u for u in recovery.analyze(root).unreadable if u.session_id == lead.name]
    assert "segments before it are missing" in item.error
