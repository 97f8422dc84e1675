"""The checkpoint benchmark (oracle.bench_checkpoints) measures roots that are what it says."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from oracle.bench_checkpoints import _disk_bytes, checkpoint_root, seal_like_a_daemon
from oracle.bench_scale import generate_root
from oracle.kill import exit_without_close
from substrat import compaction
from substrat.fsck import check
from substrat.orchestrator import Orchestrator
from substrat.segments import list_sealed


def _state(path: Path) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        orch = await Orchestrator.open(path)
        state = {
            orch.tree.path(n.agent_id): (n.state.value, orch.turn_counts[n.agent_id])
            for n in orch.tree.walk()
        }
        exit_without_close(orch)
        return state

    return asyncio.run(go())


def test_checkpointed_root_reads_no_log_line_and_keeps_its_state(tmp_path: Path) -> None:
    root = generate_root(tmp_path / "root", 120, 10)
    before = _state(root.path)
    read = checkpoint_root(root.path)
    assert read == {"events_read": 0, "checkpoints_used": 121, "read_in_full": 0}
    assert _state(root.path) == before


def test_sealed_like_a_daemon_then_archived_is_healthy_and_smaller(tmp_path: Path) -> None:
    root = generate_root(tmp_path / "root", 1, 2000)
    before = _state(root.path)
    made = seal_like_a_daemon(root, 64 << 10)
    assert made >= 3
    assert check(root.path).exit_code == 0
    full = _disk_bytes(root.path)
    report = compaction.compact(root.path, segment_bytes=64 << 10)
    assert report.errors == [] and report.archived >= made
    log = next(root.path.glob("agents/*/events.jsonl"))
    assert all(s.archived for s in list_sealed(log))
    assert _disk_bytes(root.path) < full / 2
    assert check(root.path).exit_code == 0
    assert _state(root.path) == before
