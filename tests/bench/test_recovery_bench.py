"""Recovery at scale and the crash fuzzers' throughput (run: pytest tests/bench -p no:xdist).

The one-million-event roots live only in ``python -m oracle.bench`` (ci/bench.sh);
these use 100k events so the suite stays a few minutes long. Nothing asserts on
time; each benchmark asserts that what it timed did the whole job.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from oracle import bench_fuzz as bench
from oracle.bench_scale import ScaleRoot, generate_root, parse_floor
from substrat.orchestrator import Orchestrator

EVENTS = 100_000


@pytest.fixture(scope="module")
def wide_root(tmp_path_factory: pytest.TempPathFactory) -> ScaleRoot:
    return generate_root(tmp_path_factory.mktemp("wide") / "root", EVENTS // 100, 100)


@pytest.fixture(scope="module")
def deep_root(tmp_path_factory: pytest.TempPathFactory) -> ScaleRoot:
    return generate_root(tmp_path_factory.mktemp("deep") / "root", 1, EVENTS)


def _open(root: ScaleRoot) -> Orchestrator:
    return asyncio.run(Orchestrator.open(root.path))


@pytest.mark.parametrize("shape", ["wide", "deep"])
def test_orchestrator_open(benchmark: Any, shape: str, request: pytest.FixtureRequest) -> None:
    root: ScaleRoot = request.getfixturevalue(f"{shape}_root")
    benchmark.group = "recovery"
    orch = benchmark.pedantic(_open, args=(root,), rounds=3, iterations=1)
    report = orch.recovery_report
    assert report is not None
    assert report.events_read == root.events
    assert len(orch.tree) == root.agents
    assert not report.log_damage and not report.log_repairs
    benchmark.extra_info["events_per_s"] = round(root.events / benchmark.stats.stats.min)


def test_parse_floor(benchmark: Any, wide_root: ScaleRoot) -> None:
    """json.loads of every line of the same logs: what recovery is compared with."""
    benchmark.group = "recovery"
    benchmark.pedantic(parse_floor, args=(wide_root,), rounds=3, iterations=1)


def test_crash_fuzzer_cycles(benchmark: Any) -> None:
    benchmark.group = "fuzzing"
    rate = benchmark.pedantic(bench.fuzz_cycles, kwargs={"episodes": 4}, rounds=1, iterations=1)
    benchmark.extra_info["cycles_per_cpu_s"] = round(rate)
    assert rate > 0


def test_sweep_rate(benchmark: Any) -> None:
    benchmark.group = "fuzzing"
    rate = benchmark.pedantic(
        bench.sweep_rate, kwargs={"names": ("roots",)}, rounds=1, iterations=1
    )
    benchmark.extra_info["states_per_cpu_s"] = round(rate)
    assert rate > 0
