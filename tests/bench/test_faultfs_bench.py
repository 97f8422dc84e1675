"""faultfs throughput: simulated operations/s and crash images/s, against pyfakefs and disk.

Run with ``pytest tests/bench/test_faultfs_bench.py --benchmark-only -s``. The
same workload (an fsynced append log plus atomic JSON rewrites, with stats
and listings) runs on faultfs, on pyfakefs alone, and on the real file system
(real fsync) in the same run; test_ratios prints the ratios and stores them
in the benchmark's extra_info. Nothing asserts on absolute times.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from faultfs import FaultFS, explore

pyfakefs_unittest = pytest.importorskip("pyfakefs.fake_filesystem_unittest")

from oracle.bench_io import _fs_workload as fs_workload  # noqa: E402

ITERATIONS = 100
ROOT = "/faultfs-bench"


def workload(root: str) -> int:
    """The measured program (shared with ``python -m oracle.bench``): the os calls it made."""
    return fs_workload(root, ITERATIONS)


def on_faultfs(record_trace: bool = True) -> int:
    fs = FaultFS(ROOT, record_trace=record_trace)
    with fs:
        return workload(ROOT)


def on_real(base: Path) -> Callable[[], int]:
    counter = iter(range(10**9))

    def run() -> int:
        root = base / f"r{next(counter)}"
        root.mkdir()
        return workload(str(root))

    return run


def best_of(fn: Callable[[], int], rounds: int) -> tuple[float, int]:
    best = float("inf")
    calls = 0
    for _ in range(rounds):
        start = time.perf_counter()
        calls = fn()
        best = min(best, time.perf_counter() - start)
    return best, calls


def pyfakefs_runner() -> tuple[Any, Callable[[], int]]:
    patcher = pyfakefs_unittest.Patcher()
    counter = iter(range(10**9))

    def run() -> int:
        root = f"{ROOT}/p{next(counter)}"
        os.makedirs(root)
        return workload(root)

    return patcher, run


def test_ops_faultfs(benchmark: Any) -> None:
    calls = benchmark(on_faultfs)
    benchmark.extra_info["os_calls_per_run"] = calls


def test_ops_faultfs_without_trace(benchmark: Any) -> None:
    benchmark(on_faultfs, False)


def test_ops_pyfakefs(benchmark: Any) -> None:
    patcher, run = pyfakefs_runner()
    with patcher:
        benchmark(run)


def test_ops_real_fs(benchmark: Any, tmp_path: Path) -> None:
    benchmark.pedantic(on_real(tmp_path), rounds=3, iterations=1)


def test_ratios(benchmark: Any, tmp_path: Path) -> None:
    """All three in the same run; ratios are per simulated os call."""
    faultfs_s, calls = best_of(on_faultfs, 7)
    patcher, run = pyfakefs_runner()
    with patcher:
        pyfakefs_s, _ = best_of(run, 7)
    real_s, _ = best_of(on_real(tmp_path), 2)
    ops = {
        "faultfs_ops_per_s": calls / faultfs_s,
        "pyfakefs_ops_per_s": calls / pyfakefs_s,
        "real_fs_ops_per_s": calls / real_s,
    }
    ops["faultfs_vs_pyfakefs"] = ops["faultfs_ops_per_s"] / ops["pyfakefs_ops_per_s"]
    ops["faultfs_vs_real_fs"] = ops["faultfs_ops_per_s"] / ops["real_fs_ops_per_s"]
    benchmark.extra_info.update({k: round(v, 2) for k, v in ops.items()})
    print("\nfaultfs throughput:", json.dumps({k: round(v, 2) for k, v in ops.items()}))
    benchmark.pedantic(on_faultfs, rounds=1, iterations=1)


def crashed_state() -> FaultFS:
    """A crash point with unsynced appends and an unsynced atomic write pending."""
    fs = FaultFS(ROOT, block_size=64)
    with fs:
        workload(ROOT)
        fd = os.open(fs.path("events.jsonl"), os.O_WRONLY | os.O_APPEND)
        for i in range(4):
            os.write(fd, b"x" * 100 + str(i).encode())
        os.close(fd)
        with open(fs.path("state.json.tmp"), "w") as handle:
            handle.write("{}")
        os.replace(fs.path("state.json.tmp"), fs.path("state.json"))
    return fs


@pytest.mark.parametrize("mode", ["process", "power", "torn", "reorder"])
def test_crash_images_per_second(benchmark: Any, mode: str) -> None:
    fs = crashed_state()

    def images() -> int:
        return sum(1 for _ in fs.crash_images(mode, limit=32))

    count = benchmark(images)
    benchmark.extra_info["images_per_call"] = count
    benchmark.extra_info["images_per_s"] = round(count / benchmark.stats.stats.mean, 1)
    print(f"\n{mode}: {benchmark.extra_info['images_per_s']} images/s")


def test_explore_cycles_per_second(benchmark: Any) -> None:
    """Crash, image, recover and check: the cycle the crash fuzzers repeat."""

    def small(fs: FaultFS) -> None:
        for i in range(3):
            tmp = fs.path("s.tmp")
            with open(tmp, "w") as handle:
                json.dump({"v": i}, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, fs.path("s"))
            dfd = os.open(fs.root, os.O_RDONLY)
            os.fsync(dfd)
            os.close(dfd)
            fs.ack(i)

    def check(img: FaultFS) -> None:
        if img.acked:
            with open(img.path("s")) as handle:
                assert json.load(handle)["v"] >= img.acked[-1]

    def run() -> int:
        report = explore(small, check, dedupe=False, images_per_mode=4)
        assert report.ok
        return report.images_checked

    cycles = benchmark(run)
    benchmark.extra_info["cycles_per_s"] = round(cycles / benchmark.stats.stats.mean, 1)
    print(f"\nexplore: {benchmark.extra_info['cycles_per_s']} crash-recover-check cycles/s")


def test_passthrough_overhead_per_call(benchmark: Any, tmp_path: Path) -> None:
    """os.stat on a real path: the cost interception adds to calls it does not own."""
    real = str(tmp_path)
    n = 20_000

    def loop() -> None:
        for _ in range(n):
            os.stat(real)

    plain_s, _ = best_of(lambda: loop() or 0, 3)
    with FaultFS(ROOT):
        patched_s, _ = best_of(lambda: loop() or 0, 3)
        benchmark(loop)
    overhead_us = (patched_s - plain_s) / n * 1e6
    benchmark.extra_info["passthrough_overhead_us"] = round(overhead_us, 3)
    print(f"\npassthrough overhead: {overhead_us:.3f} us per os.stat")
