"""The benchmark tools (oracle.bench_table, bench_io, bench_scale) measure what they claim."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from oracle.bench_io import LOG_BEFORE_REV, eventlog_at, log_cost
from oracle.bench_scale import ScaleRoot, daemon_cold_start, generate_root, parse_floor
from oracle.bench_table import Row, render
from substrat import eventlog
from substrat.agents import USER
from substrat.fsck import check
from substrat.orchestrator import Orchestrator


def test_generated_root_is_a_healthy_root_that_recovers_in_full(tmp_path: Path) -> None:
    root = generate_root(tmp_path / "root", 150, 10)
    assert root.events == 150 * 10 + 50  # 50 children each sent the user one message
    findings = check(root.path)
    assert findings.exit_code == 0, findings.to_dict()

    orch = asyncio.run(Orchestrator.open(root.path))
    report = orch.recovery_report
    assert report is not None
    assert report.events_read == root.events
    assert not report.log_damage and not report.log_repairs and not report.reconciled
    assert len(orch.tree) == 150 and len(orch.tree.roots()) == 100
    assert len(orch.inboxes.inbox(USER)) == 50
    assert parse_floor(root) > 0


def test_the_scale_rows_roots_are_ones_the_daemon_starts_on(tmp_path: Path) -> None:
    """The recovery rows time a daemon's start on a generated root and on an empty one;
    both must be private (the daemon refuses a group- or world-readable directory)."""
    generated = generate_root(tmp_path / "root", 2, 10)
    assert generated.path.stat().st_mode & 0o777 == 0o700
    assert daemon_cold_start(generated).cpu_seconds > 0
    empty = ScaleRoot(tmp_path / "empty", 0, 0, 0)
    empty.path.mkdir(mode=0o700)
    assert daemon_cold_start(empty).cpu_seconds > 0


def test_table_has_one_row_per_figure_with_its_ratio() -> None:
    rows = [
        Row("EventLog.log", 300.0, "us", "raw", 150.0, target="<= 2.2x", met=True),
        Row("no baseline", 5.0, "/s", "old", None),
    ]
    lines = render(rows).splitlines()
    assert len(lines) == 4
    assert "| 2.00x |" in lines[2] and "| yes |" in lines[2]
    assert "| n/a |" in lines[3]


def test_the_log_baseline_is_the_two_fsync_log_before_issue_15(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The "before" row measures what it says: EventLog.log as of LOG_BEFORE_REV makes two
    fsyncs per entry (its pending copy, then the log), today's makes one."""
    old = eventlog_at(LOG_BEFORE_REV)
    if old is None:
        pytest.skip(f"git cannot show {LOG_BEFORE_REV} here (a shallow clone)")
    real = os.fsync
    synced: list[int] = []

    def counting(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    counts = []
    for module, name in ((old, "before"), (eventlog, "now")):
        (tmp_path / name).mkdir()
        with module.EventLog(tmp_path / name / "events.jsonl", {"session_id": "s"}) as log:
            synced.clear()
            log.log("turn.start", {"prompt": "x"})
            counts.append(len(synced))
    assert counts == [2, 1]
    logged, raw, before = log_cost(appends=5)
    assert logged > 0 and raw > 0 and before is not None and before > 0


def test_rounds_interleave_and_report_the_median_with_its_spread() -> None:
    from oracle.bench_table import median_rounds

    order: list[str] = []
    values = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 5.0, 9.0])}

    def make(name: str) -> Any:
        def run() -> float:
            order.append(name)
            return next(values[name])

        return run

    got = median_rounds({"a": make("a"), "b": make("b"), "none": lambda: None}, 3)
    assert order == ["a", "b"] * 3  # interleaved, figure and baseline under the same load
    assert got == {"a": (2.0, 1.0, 3.0), "b": (5.0, 5.0, 9.0), "none": None}
    row = Row("rate", 2.0, "/s", "base", 5.0, spread=(1.0, 3.0), baseline_spread=(5.0, 9.0))
    line = render([row]).splitlines()[2]
    assert "| 2.00 /s (1.00-3.00) |" in line and "| 5.00 /s (5.00-9.00) |" in line
    assert "| 0.40x |" in line
