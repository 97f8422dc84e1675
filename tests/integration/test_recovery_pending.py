"""A start repairs each log from its pending copy, found by the one listing of the log's
directory that recovery makes (issue 17's sixth pass: the pending file is looked for only
when that listing shows it). Real files, the real orchestrator.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from substrat import start_summary
from substrat.orchestrator import Orchestrator


@pytest.mark.parametrize("in_log", [False, True])
def test_recovery_replays_a_pending_entry_its_log_lacks_and_only_then(
    root: Path, in_log: bool
) -> None:
    """A start repairs each log from its pending copy (the entry a kill cut off the log's
    end is appended again), found by the one listing of the log's directory that
    recovery makes; an entry the log already holds is not appended twice. Either way
    the pending file is gone afterwards."""

    async def make() -> str:
        orch = await Orchestrator.open(root)
        try:
            await orch.create_root("ada", "ada instructions")
            await orch.run_turn("ada", "hello")
            return orch.get("ada").session_id
        finally:
            await orch.close()

    sid = asyncio.run(make())
    log = root / "agents" / sid / "events.jsonl"
    whole = log.read_bytes()
    last = whole.splitlines(keepends=True)[-1]
    if not in_log:
        log.write_bytes(whole[: -len(last)])  # a kill cut the last entry off the log
    (log.parent / "events.pending").write_bytes(last)
    # a kill leaves no start summary (the start before it retired the one the clean stop
    # wrote: substrat.start_summary), so this start reads every log as after a kill
    Path(start_summary.summary_path(root)).unlink()

    async def reopen() -> dict[str, Any]:
        orch = await Orchestrator.open(root)
        try:
            assert orch.recovery_report is not None
            return orch.recovery_report.log_repairs.get(sid, {})
        finally:
            await orch.close()

    repairs = asyncio.run(reopen())
    assert log.read_bytes() == whole, "the entry is in the log once"
    assert bool(repairs.get("pending_replayed")) is not in_log
    assert not (log.parent / "events.pending").exists()
