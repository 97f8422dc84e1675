"""Benchmark rows of checkpoints and compaction (issue 16), each a ratio in one run.

* **start with vs without checkpoints**: a generated root (both shapes: many
  agents of 100 events, one agent holding them all) is started by the daemon
  once with no checkpoint store (recovery reads every line), checkpointed, then
  started again; time to the first ``ping`` and peak RSS of both starts.
* **growth**: a fixed number of agents, ever longer histories, every log
  checkpointed: ``Orchestrator.open`` CPU seconds against the same root with
  its checkpoint store moved away.
* **EventLog.log with the policy on**: median append latency through a log
  pool whose appends feed a :class:`~substrat.checkpointer.Checkpointer` (the
  daemon's policy, background worker) against a plain ``EventLog``, shuffled
  round by round.
* **disk**: a long history as a daemon under ``keep`` leaves it (sealed
  segments of ``SUBSTRAT_SEGMENT_BYTES``), then ``substrat compact`` (archive):
  bytes on disk before and after.

``python -m oracle.bench_checkpoints`` prints these rows alone; ``python -m
oracle.bench`` includes them.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from oracle.bench_scale import (
    ScaleRoot,
    daemon_cold_start,
    generate_root,
    inprocess_open,
)
from substrat.checkpointer import Checkpointer, CheckpointPolicy
from substrat.checkpoints import CHECKPOINTS_DIR, Settled
from substrat.eventlog import LOG_NAME, EventLog, decode_line
from substrat.logs import LogPool
from substrat.segments import sealed_name, stored_bytes
from substrat.session import SessionStore
from substrat.session.store import AGENTS_DIR

MIB = 1 << 20
START_EVENTS = 1_000_000
GROWTH_AGENTS = 100
GROWTH_SCALES = (10_000, 100_000, 1_000_000)
LOG_APPENDS = 2000
DISK_SEGMENT_BYTES = 8 << 20
START_RATIO_TARGET = 0.05
RSS_TARGET_MIB = 96
LATENCY_RATIO_TARGET = 1.05


def checkpoint_root(path: Path) -> dict[str, int]:
    """Open ``path``, checkpoint every log, close cleanly; what recovery then reads."""
    from substrat.orchestrator import Orchestrator

    async def run() -> None:
        orch = await Orchestrator.open(path, checkpoints=CheckpointPolicy())
        await orch.checkpoint()
        await orch.close()

    async def reopen() -> dict[str, int]:
        orch = await Orchestrator.open(path, checkpoints=CheckpointPolicy())
        report = orch.recovery_report
        assert report is not None
        # a clean stop again: the open retired the start summary (see
        # substrat.start_summary), the close writes it for the start measured next
        await orch.close()
        return {
            "events_read": report.events_read,
            "checkpoints_used": report.checkpoints_used,
            "read_in_full": len(report.read_in_full),
        }

    asyncio.run(run())
    return asyncio.run(reopen())


def _without_store(path: Path) -> Path:
    """Move the root's checkpoint store aside; returns where (put it back with rename)."""
    aside = path.parent / f"{path.name}.checkpoints-aside"
    os.rename(path / CHECKPOINTS_DIR, aside)
    return aside


# -- 1. daemon start with and without checkpoints ----------------------------------------


def start_rows(events: int = START_EVENTS) -> list[Any]:
    from oracle.bench import Row

    rows: list[Row] = []
    shapes = ((max(1, events // 100), 100), (1, events))
    with tempfile.TemporaryDirectory(prefix="substrat-ckpt-start-") as tmp:
        empty = ScaleRoot(Path(tmp) / "empty", 0, 0, 0)
        empty.path.mkdir(mode=0o700)  # an empty directory is adopted only if private
        # interpreter, imports, lock, socket: what a daemon costs before any log
        fixed_s = daemon_cold_start(empty).cpu_seconds
        for agents, per_agent in shapes:
            root = generate_root(Path(tmp) / f"root{agents}", agents, per_agent)
            without = daemon_cold_start(root)
            shutil.rmtree(root.path / CHECKPOINTS_DIR, ignore_errors=True)  # its clean stop
            read = checkpoint_root(root.path)
            assert read["read_in_full"] == 0 and read["events_read"] == 0, read
            with_ = daemon_cold_start(root)
            label = f"start with checkpoints, {agents:,} x {per_agent:,} events"
            ratio = with_.seconds / without.seconds
            rows += [
                Row(
                    f"{label}: spawn to first ping, s",
                    with_.seconds,
                    "s",
                    "the same root without checkpoints",
                    without.seconds,
                    higher_is_better=False,
                    target=f"<= {START_RATIO_TARGET}x",
                    met=ratio <= START_RATIO_TARGET,
                ),
                Row(
                    f"{label}: daemon CPU s until ping",
                    with_.cpu_seconds,
                    "s",
                    "the same root without checkpoints",
                    without.cpu_seconds,
                    higher_is_better=False,
                ),
                Row(
                    f"{label}: daemon CPU s until ping above an empty root's ({fixed_s:.2f} s)",
                    max(0.0, with_.cpu_seconds - fixed_s),
                    "s",
                    "the same root without checkpoints",
                    without.cpu_seconds - fixed_s,
                    higher_is_better=False,
                ),
                Row(
                    f"{label}: daemon peak RSS",
                    with_.peak_rss_bytes / MIB,
                    "MiB",
                    "the same root without checkpoints",
                    without.peak_rss_bytes / MIB,
                    higher_is_better=False,
                    target=f"< {RSS_TARGET_MIB} MiB",
                    met=with_.peak_rss_bytes < RSS_TARGET_MIB * MIB,
                ),
            ]
            shutil.rmtree(root.path)
    return rows


# -- 2. growth with a fixed number of agents -------------------------------------------


def growth_rows(scales: tuple[int, ...] = GROWTH_SCALES) -> list[Any]:
    from oracle.bench import Row

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="substrat-ckpt-growth-") as tmp:
        for events in scales:
            root = generate_root(
                Path(tmp) / f"root{events}", GROWTH_AGENTS, max(4, events // GROWTH_AGENTS)
            )
            checkpoint_root(root.path)
            with_ = inprocess_open(root, 3)
            aside = _without_store(root.path)
            without = inprocess_open(root, 3 if events < 200_000 else 1)
            os.rename(aside, root.path / CHECKPOINTS_DIR)
            rows.append(
                Row(
                    f"growth with checkpoints: Orchestrator.open, {GROWTH_AGENTS} agents, "
                    f"{root.events:,} events, CPU s",
                    with_.cpu_seconds,
                    "s",
                    "the same root without checkpoints",
                    without.cpu_seconds,
                    higher_is_better=False,
                )
            )
            shutil.rmtree(root.path)
    return rows


# -- 3. EventLog.log with the policy on ------------------------------------------------


class QuietHost:
    """A host whose every log is quiet and settled (no turns run in this benchmark)."""

    def settled(self) -> Settled:
        return Settled({}, strict=True)

    def quiet(self, endpoint: str) -> bool:
        return True


def checkpointed_log(
    root: Path, policy: CheckpointPolicy
) -> tuple[LogPool, Checkpointer, EventLog]:
    """One agent's log in ``root`` whose appends feed a checkpointer with ``policy`` (its
    host: :class:`QuietHost`): the pool, the checkpointer and the open log."""
    pool = LogPool(SessionStore(root))
    checkpointer = Checkpointer(root, pool, policy, QuietHost())
    checkpointer.adopt()
    pool.on_append = checkpointer.appended
    sid = "a" * 32
    (root / AGENTS_DIR / sid).mkdir(parents=True)
    return pool, checkpointer, pool.get(sid)


def log_latency(appends: int = LOG_APPENDS, seed: int = 0) -> tuple[float, float, int]:
    """Median microseconds of ``EventLog.log`` with the daemon's checkpoint policy on and
    off (interleaved, shuffled per round), and how many checkpoints were written."""
    data = {"turn_id": "t12", "prompt": "summarise the design document in three bullet points"}
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="substrat-ckpt-log-", dir=os.getcwd()) as tmp:
        on_root, off_root = Path(tmp) / "on", Path(tmp) / "off"
        on_root.mkdir()
        off_root.mkdir()
        pool, checkpointer, on_log = checkpointed_log(on_root, CheckpointPolicy(background=True))
        off_log = EventLog(off_root / LOG_NAME, {"session_id": on_log.path.parent.name})

        async def run() -> None:
            for _ in range(appends):
                order = [("on", on_log), ("off", off_log)]
                rng.shuffle(order)
                for name, log in order:
                    started = time.perf_counter()
                    log.log("turn.start", data)
                    samples[name].append(time.perf_counter() - started)
                await asyncio.sleep(0)  # the worker's results come back on the loop
            await checkpointer.close()

        asyncio.run(run())
        pool.close_all()
        off_log.close()
    on_us = statistics.median(samples["on"]) * 1e6
    off_us = statistics.median(samples["off"]) * 1e6
    return on_us, off_us, checkpointer.stats.written


def latency_rows(appends: int = LOG_APPENDS) -> list[Any]:
    from oracle.bench import Row

    on_us, off_us, written = log_latency(appends)
    assert written >= appends // CheckpointPolicy().every_entries, written
    return [
        Row(
            f"EventLog.log with the checkpoint policy on (median, {written} checkpoints)",
            on_us,
            "us",
            "the policy off",
            off_us,
            higher_is_better=False,
            target=f"<= {LATENCY_RATIO_TARGET}x",
            met=on_us <= LATENCY_RATIO_TARGET * off_us,
        )
    ]


# -- 4. disk with a compaction policy --------------------------------------------------


def seal_like_a_daemon(root: ScaleRoot, segment_bytes: int) -> int:
    """Split every log of ``root`` into sealed segments of about ``segment_bytes``, as a
    daemon under ``keep`` would have left them (the last part stays active); how many."""
    made = 0
    for log in root.path.glob(f"{AGENTS_DIR}/*/{LOG_NAME}"):
        with open(log, "rb") as handle:
            lines = handle.readlines()
        part: list[bytes] = []
        size = 0
        first = 1
        for line in lines:
            part.append(line)
            size += len(line)
            if size >= segment_bytes:
                entry = decode_line(line[:-1])
                assert not isinstance(entry, str), entry
                last = int(entry["seq"])
                (log.parent / sealed_name(first, last)).write_bytes(b"".join(part))
                made += 1
                first, part, size = last + 1, [], 0
        log.write_bytes(b"".join(part))
    return made


def _disk_bytes(path: Path) -> int:
    return sum(stored_bytes(log) for log in path.glob(f"{AGENTS_DIR}/*/{LOG_NAME}")) + (
        stored_bytes(path / "user" / LOG_NAME)
    )


def disk_rows(events: int = START_EVENTS, segment_bytes: int = DISK_SEGMENT_BYTES) -> list[Any]:
    from oracle.bench import Row
    from substrat import compaction

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="substrat-ckpt-disk-") as tmp:
        root = generate_root(Path(tmp) / "keep", 1, events)
        segments = seal_like_a_daemon(root, segment_bytes)
        before = _disk_bytes(root.path)
        report = compaction.compact(root.path, segment_bytes=segment_bytes)
        assert not report.errors, report.errors
        after = _disk_bytes(root.path)
        read = checkpoint_root(root.path)
        assert read["read_in_full"] == 0, read
        rows.append(
            Row(
                f"disk, 1 agent x {root.events:,} events in {segments} segments of "
                f"{segment_bytes // MIB} MiB: logs after compact (archive), MiB",
                after / MIB,
                "MiB",
                "the same history kept in full",
                before / MIB,
                higher_is_better=False,
            )
        )
    return rows


def checkpoint_rows(
    *, events: int = START_EVENTS, growth: tuple[int, ...] = GROWTH_SCALES
) -> list[Any]:
    """Every row of this module (see the module docstring)."""
    return [*start_rows(events), *growth_rows(growth), *latency_rows(), *disk_rows(events)]


def main(argv: list[str] | None = None) -> int:
    import argparse

    from oracle.bench import render

    parser = argparse.ArgumentParser(description="checkpoint and compaction benchmark rows")
    parser.add_argument("--events", type=int, default=START_EVENTS)
    parser.add_argument("--growth", type=int, nargs="*", default=list(GROWTH_SCALES))
    parser.add_argument(
        "--only", choices=("start", "growth", "latency", "disk"), action="append", default=[]
    )
    args = parser.parse_args(argv)
    parts = {
        "start": lambda: start_rows(args.events),
        "growth": lambda: growth_rows(tuple(args.growth)),
        "latency": latency_rows,
        "disk": lambda: disk_rows(args.events),
    }
    rows = [row for name in (args.only or list(parts)) for row in parts[name]()]
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
