"""CPU seconds per pytest item, and how a campaign of such items spreads over workers.

Load it into a run with ``-p oracle.item_cpu`` and name a file in
``SUBSTRAT_ITEM_CPU``: every item (set-up, call and teardown) appends one JSON
line with its node id, the process id, the CPU seconds of the process that ran it (user and
system, plus its child processes': those it waited for, such as a killed daemon, and
those still alive, such as a fixture's server, for what they did during the item; not a
process that left its tree, such as a daemon a ``substrat`` command started, whose parent
becomes init), its
wall seconds and when it started and ended (Unix time). It works under xdist
(each worker appends its own lines). Where Linux reports it (``/proc/thread-self/schedstat``)
the line also says how long the item's thread sat ready for a CPU that others held
(``ready_s``) and how long it was blocked, neither on a CPU nor ready for one
(``blocked_s``: sleeping, polling, waiting for a child process, a socket or the disk). On a
loaded machine wall minus CPU is mostly the first; the second is what a wait costs.

``python -m oracle.item_cpu FILE [--workers 64]`` summarises a run: total CPU
seconds, the longest items with their share of the total, and the wall time a
run on N workers cannot beat (the longest item, or the total over N) next to
the time greedy scheduling of the measured items gives (longest first, each to
the worker that frees up first; xdist hands out items in collection order,
which can only be as good), and how long each worker of the measured run sat
idle at its end while another still ran items (the run's tail).

CPU time, not wall time, because this machine is shared: another process's
load stretches wall time, much less the CPU an item needs.
"""

from __future__ import annotations

import argparse
import glob
import heapq
import json
import os
import sys
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import pytest

ENV = "SUBSTRAT_ITEM_CPU"
SHOWN = 12


_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _live_children_cpu_s() -> float:
    """CPU seconds of this process's children that are still alive (or not yet reaped).

    A long-lived helper process (a module-scoped fixture's server, say) is
    reaped only when its fixture is torn down; ``os.times`` would then charge
    everything it did for a whole module to the item that happened to be last.
    Counting live children as they go charges each item what they did during it.
    Each child's own waited-for children are in its ``cutime``/``cstime``.
    """
    total_ticks = 0
    for listing in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        try:
            with open(listing) as handle:
                pids = handle.read().split()
        except OSError:  # the thread ended meanwhile
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:  # reaped meanwhile: os.times counts it now
                continue
            total_ticks += sum(int(field) for field in fields[11:15])  # utime..cstime
    return total_ticks / _TICKS_PER_S


_SCHEDSTAT = "/proc/thread-self/schedstat"


def _thread_sched_s() -> tuple[float, float] | None:
    """This thread's seconds on a CPU and ready for one so far (None: not reported)."""
    try:
        with open(_SCHEDSTAT) as handle:
            on_cpu_ns, ready_ns, _ = handle.read().split()
    except (OSError, ValueError):
        return None
    return int(on_cpu_ns) / 1e9, int(ready_ns) / 1e9


def _cpu_s() -> float:
    """This process's CPU, its reaped children's, and its live children's so far."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + _live_children_cpu_s()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, Any, None]:
    path = os.environ.get(ENV)
    sched = _thread_sched_s()
    cpu, wall, start = _cpu_s(), time.perf_counter(), time.time()
    yield
    if path:
        wall_s = time.perf_counter() - wall
        line: dict[str, Any] = {
            "item": item.nodeid,
            "pid": os.getpid(),
            "cpu_s": round(_cpu_s() - cpu, 3),
            "wall_s": round(wall_s, 3),
            "start": round(start, 3),
            "end": round(time.time(), 3),
        }
        after = _thread_sched_s()
        if sched is not None and after is not None:
            on_cpu_s, ready_s = after[0] - sched[0], after[1] - sched[1]
            line["ready_s"] = round(ready_s, 3)
            line["blocked_s"] = round(max(0.0, wall_s - on_cpu_s - ready_s), 3)
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


@dataclass(frozen=True)
class Spread:
    """What a list of item CPU times means for a run on ``workers`` workers."""

    total_s: float
    longest_s: float
    longest_item: str
    workers: int
    bound_s: float
    """No schedule is faster: max(longest item, total / workers)."""
    greedy_s: float
    """Longest item first, each to the worker that frees up first."""


def spread(items: dict[str, float], workers: int) -> Spread:
    assert workers >= 1 and items, "need items and at least one worker"
    total = sum(items.values())
    name, longest = max(items.items(), key=lambda kv: kv[1])
    finish = [0.0] * workers
    for cost in sorted(items.values(), reverse=True):
        heapq.heapreplace(finish, finish[0] + cost)
    return Spread(total, longest, name, workers, max(longest, total / workers), max(finish))


def load(path: str) -> dict[str, tuple[float, float]]:
    """Node id -> (CPU s, wall s); an item run twice (a re-run) keeps its last line."""
    out: dict[str, tuple[float, float]] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                row = json.loads(line)
                out[row["item"]] = (row["cpu_s"], row["wall_s"])
    return out


def blocked(path: str) -> dict[str, float]:
    """Node id -> seconds its thread was blocked (lines without ``blocked_s`` left out)."""
    out: dict[str, float] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                row = json.loads(line)
                if "blocked_s" in row:
                    out[row["item"]] = row["blocked_s"]
    return out


def tails(path: str) -> dict[int, tuple[float, float]]:
    """Worker pid -> (seconds from its first item's start to its last item's end, seconds it
    sat idle at the end while another worker still ran items). Lines without times (from
    an older run) are left out."""
    spans: dict[int, list[float]] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                row = json.loads(line)
                if "start" in row:
                    span = spans.setdefault(row["pid"], [row["start"], row["end"]])
                    span[0], span[1] = min(span[0], row["start"]), max(span[1], row["end"])
    if not spans:
        return {}
    last = max(end for _, end in spans.values())
    return {pid: (end - start, last - end) for pid, (start, end) in spans.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="CPU seconds per pytest item, and their spread")
    parser.add_argument("file")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 64])
    parser.add_argument("--shown", type=int, default=SHOWN)
    args = parser.parse_args(argv)
    rows = load(args.file)
    cpu = {item: c for item, (c, _) in rows.items()}
    total = sum(cpu.values())
    print(f"{len(rows)} items, {total:.1f} CPU s in all, {sum(w for _, w in rows.values()):.1f} s")
    print("\n| item | CPU s | share | wall s |\n|---|---:|---:|---:|")
    for item, (c, w) in sorted(rows.items(), key=lambda kv: -kv[1][0])[: args.shown]:
        print(f"| `{item}` | {c:.1f} | {100 * c / total:.1f}% | {w:.1f} |")
    print("\n| workers | bound (s) | greedy (s) | longest item (s) |\n|---:|---:|---:|---:|")
    for n in args.workers:
        s = spread(cpu, n)
        print(f"| {n} | {s.bound_s:.1f} | {s.greedy_s:.1f} | {s.longest_s:.1f} |")
    waits = blocked(args.file)
    if waits:
        print(f"\nblocked (neither on a CPU nor ready for one): {sum(waits.values()):.1f} s in all")
        print("\n| item | blocked s | CPU s |\n|---|---:|---:|")
        for item, seconds in sorted(waits.items(), key=lambda kv: -kv[1])[: args.shown]:
            print(f"| `{item}` | {seconds:.1f} | {cpu.get(item, 0.0):.1f} |")
    workers = tails(args.file)
    if workers:
        print("\n| worker (pid) | busy span (s) | idle at the end (s) |\n|---:|---:|---:|")
        for pid, (busy, idle) in sorted(workers.items()):
            print(f"| {pid} | {busy:.1f} | {idle:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
