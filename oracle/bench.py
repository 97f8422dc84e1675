"""The benchmark table: fuzzing throughput, sweep rate, recovery at scale, durability cost.

Run ``python -m oracle.bench`` (or ``ci/bench.sh``). It prints one markdown
table; every figure sits next to a baseline measured in the same run, so the
ratio means something on a busy machine too:

* crash fuzzing and the sweep against the same code at ``--baseline-rev`` (a
  git revision, extracted to a temporary directory and run in a subprocess);
* recovery against a floor: reading the same logs with ``json.loads`` per line,
  and the 10k-event root's time per event for the growth rows;
* ``EventLog.log`` against a raw ``write`` + ``fsync`` of the same bytes, and against
  ``EventLog.log`` as of ``LOG_BEFORE_REV`` (before issue 15: two fsyncs per entry);
* faultfs against pyfakefs alone and against the real file system.

Rates of CPU-bound work are per CPU second of one process (``time.process_time``),
which is what "one core" means and what other load on the machine disturbs least.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

BASELINE_REV = "1fa8a4582ed8ce7b8ef6d09e52c926ccf5ceec18"
"""main just before the issue-9 optimisations (orjson, one read per log at recovery, ...)."""
FUZZ_EPISODES = 20
FUZZ_STEPS = 30
HYPOTHESIS_EXAMPLES = 100
LIFECYCLE_EXAMPLES = 100
FUZZ_ROUNDS = 3
"""Interleaved rounds of each fuzzing row and its baselines; the table shows the median."""
ORIGIN_PERSISTENCE_FUZZER = 342.0
"""Crash-recover-check cycles per CPU s of the origin's persistence-only crash fuzzer
(Hardcode84/2, measured on this machine for issue 17; its whole-orchestrator fuzzer: 13.8)."""
ORIGIN_LIFECYCLE_FUZZER = 85.0
"""Examples per CPU s of the origin's lifecycle fuzzer, 30 steps (measured here, issue 17)."""
SWEEP_SCENARIOS = ("roots", "stranded reply", "messages both ways")
LOG_APPENDS = 300
LOG_BEFORE_REV = "8db2e09e151f40048b632b5e330c27d504e4a860"
"""main just before issue 15: ``EventLog.log`` fsynced its pending copy too (two fsyncs)."""
FAULTFS_ROUNDS = 7
GIB = 1 << 30
MIB = 1 << 20


@dataclass
class Row:
    measure: str
    figure: float
    unit: str
    baseline_name: str
    baseline: float | None
    higher_is_better: bool = True
    target: str = ""
    met: bool | None = None
    spread: tuple[float, float] | None = None
    """Lowest and highest round of ``figure`` (which is then the rounds' median)."""
    baseline_spread: tuple[float, float] | None = None

    @property
    def ratio(self) -> float | None:
        if self.baseline in (None, 0):
            return None
        assert self.baseline is not None
        return self.figure / self.baseline


# -- 1. crash-recover-check cycles of the crash fuzzer's workload -------------------


def fuzz_cycles(episodes: int = FUZZ_EPISODES, steps: int = FUZZ_STEPS, seed: int = 1) -> float:
    """Crash-recover-check cycles per CPU second, on the crash fuzzer's own draws.

    Each episode is a fresh harness with one root; then ``steps`` times: a step
    drawn as ``oracle.machines`` draws it, crashed at a random boundary in a
    random mode (sometimes crashing recovery too), recovered and checked.
    """
    from faultfs import MODES
    from oracle.harness import CrashHarness
    from oracle.machines import MAX_BOUNDARY, MAX_RECOVERY_BOUNDARY, NAMES
    from oracle.workload import STEP_KINDS, Step

    rng = random.Random(seed)

    def draw(harness: CrashHarness) -> Step:
        state = harness.model.state
        paths = sorted(state.path(a) for a in state.agents)
        if not paths:
            return Step("create_root", rng.choice(NAMES))
        kind, agent = rng.choice(STEP_KINDS), rng.choice(paths)
        if kind == "create_root":
            return Step(kind, rng.choice(NAMES))
        if kind in ("spawn", "terminate_by_parent"):
            return Step(kind, agent, rng.choice(NAMES))
        if kind in ("send", "ask"):
            return Step(kind, agent, rng.choice([*paths, "user"]))
        return Step(kind, agent)

    cycles = 0
    started = time.process_time()
    for _ in range(episodes):
        harness = CrashHarness()
        harness.run(Step("create_root", rng.choice(NAMES)))
        for _ in range(steps):
            harness.run(draw(harness), crash_at=rng.randint(1, MAX_BOUNDARY))
            again = None if rng.random() < 0.5 else rng.randint(1, MAX_RECOVERY_BOUNDARY)
            harness.crash_and_recover(rng.choice(MODES), rng.randint(0, 7), recovery_crash_at=again)
            cycles += 1
        harness.close()
    return cycles / (time.process_time() - started)


def hypothesis_cycles(examples: int = HYPOTHESIS_EXAMPLES) -> float:
    """The same, inside the Hypothesis state machine (engine, other rules and invariants)."""
    from hypothesis import HealthCheck, settings

    from oracle.harness import CrashHarness
    from oracle.machines import CrashRecoveryMachine

    count = [0]
    original = CrashHarness.crash_and_recover

    def counted(self: CrashHarness, *args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return original(self, *args, **kwargs)

    CrashHarness.crash_and_recover = counted  # type: ignore[method-assign]
    test = CrashRecoveryMachine.TestCase
    test.settings = settings(
        max_examples=examples,
        stateful_step_count=30,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    started = time.process_time()
    try:
        test("runTest").runTest()
    finally:
        CrashHarness.crash_and_recover = original  # type: ignore[method-assign]
    return count[0] / (time.process_time() - started)


def lifecycle_examples(on_disk: bool = False, examples: int = LIFECYCLE_EXAMPLES) -> float:
    """Examples per CPU second of the lifecycle fuzzer (30 steps), on faultfs or a real disk."""
    from oracle.bench_profile import run_machine
    from oracle.lifecycle import LifecycleMachine, OnDiskLifecycleMachine

    started = time.process_time()
    run_machine(OnDiskLifecycleMachine if on_disk else LifecycleMachine, examples, 30)
    return examples / (time.process_time() - started)


def lifecycle_on_disk() -> float:
    return lifecycle_examples(on_disk=True)


def median_rounds(
    functions: dict[str, Callable[[], float | None]], rounds: int
) -> dict[str, tuple[float, float, float] | None]:
    """Run every function once per round, in the same order each round.

    Returns name -> (median, lowest, highest) over the rounds (None if any
    round gave None). Interleaving puts each figure and its baseline under the
    same load, which on a shared machine moves by 2x from minute to minute.
    """
    seen: dict[str, list[float | None]] = {name: [] for name in functions}
    for _ in range(rounds):
        for name, function in functions.items():
            seen[name].append(function())
    out: dict[str, tuple[float, float, float] | None] = {}
    for name, values in seen.items():
        got = [v for v in values if v is not None]
        out[name] = (
            (statistics.median(got), min(got), max(got)) if len(got) == len(values) else None
        )
    return out


# -- 2. crash states checked by the exhaustive sweep ---------------------------------


def sweep_rate(names: tuple[str, ...] = SWEEP_SCENARIOS) -> float:
    """Crash states (and recovery-crash states) checked per CPU second, posix profile."""
    from oracle.sweep import SCENARIOS, sweep

    states = 0
    started = time.process_time()
    for name in names:
        result = sweep(SCENARIOS[name], profile="posix")
        if result.failures:
            raise RuntimeError(f"sweep {name} failed:\n" + "\n".join(result.failures))
        states += result.states + result.recovery_states
    return states / (time.process_time() - started)


def on_revision(rev: str, function: str) -> float | None:
    """Run ``function`` of this file against substrat/oracle/faultfs as of ``rev``."""
    top = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="substrat-baseline-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(top), "archive", rev, "substrat", "oracle", "faultfs"],
            capture_output=True,
        )
        if archive.returncode != 0:
            print(f"baseline {rev} unavailable: {archive.stderr.decode().strip()}", file=sys.stderr)
            return None
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        code = (
            "import importlib.util,sys\n"
            f"sys.path.insert(0, {tmp!r})\n"
            f"spec = importlib.util.spec_from_file_location('bench_probe', {__file__!r})\n"
            "module = importlib.util.module_from_spec(spec)\n"
            "sys.modules['bench_probe'] = module\n"
            "spec.loader.exec_module(module)\n"
            f"print(module.{function}())\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp, check=True
        ).stdout
    return float(out.strip().splitlines()[-1])


# -- 4. EventLog.log against a raw write + fsync, and against itself before issue 15 -------


def eventlog_at(rev: str) -> ModuleType | None:
    """``substrat.eventlog`` as of ``rev``, loaded beside today's package (its imports are
    today's ``substrat``); None when git cannot show that revision (a shallow clone)."""
    top = Path(__file__).resolve().parents[1]
    shown = subprocess.run(
        ["git", "-C", str(top), "show", f"{rev}:substrat/eventlog.py"], capture_output=True
    )
    if shown.returncode != 0:
        print(f"EventLog at {rev} unavailable: {shown.stderr.decode().strip()}", file=sys.stderr)
        return None
    name = f"substrat_eventlog_{rev[:8]}"
    with tempfile.TemporaryDirectory(prefix="substrat-old-eventlog-") as tmp:
        path = Path(tmp) / f"{name}.py"
        path.write_bytes(shown.stdout)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def log_cost(
    appends: int = LOG_APPENDS, seed: int = 0, before_rev: str | None = LOG_BEFORE_REV
) -> tuple[float, float, float | None]:
    """Median microseconds of ``EventLog.log``, of a raw write+fsync of its bytes, and of
    ``EventLog.log`` as of ``before_rev`` (None when that revision is unavailable).

    Each round runs them in a shuffled order: run back to back in a fixed order, an
    fsync right after another one is cheaper and skews the ratio.
    """
    from substrat.eventlog import EventLog, encode_entry

    data = {"turn_id": "t12", "prompt": "summarise the design document in three bullet points"}
    line = encode_entry(
        {"seq": 1, "session_id": "s" * 32, "ts": "t" * 32, "event": "turn.start", "data": data}
    )
    old = None if before_rev is None else eventlog_at(before_rev)
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {"log": [], "raw": [], "before": []}
    context = {"session_id": "s" * 32}
    with tempfile.TemporaryDirectory(prefix="substrat-logcost-", dir=os.getcwd()) as tmp:
        folder = Path(tmp)
        for sub in ("now", "before"):
            (folder / sub).mkdir()
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        raw_fd = os.open(folder / "raw.jsonl", flags, 0o600)

        def raw() -> None:
            os.write(raw_fd, line)
            os.fsync(raw_fd)

        with contextlib.ExitStack() as stack:
            log = stack.enter_context(EventLog(folder / "now" / "events.jsonl", context))
            runs: dict[str, Callable[[], object]] = {
                "log": lambda: log.log("turn.start", data),
                "raw": raw,
            }
            if old is not None:
                old_path = folder / "before" / "events.jsonl"
                old_log = stack.enter_context(old.EventLog(old_path, context))
                runs["before"] = lambda: old_log.log("turn.start", data)
            for _ in range(appends):
                order = list(runs)
                rng.shuffle(order)
                for name in order:
                    started = time.perf_counter()
                    runs[name]()
                    samples[name].append(time.perf_counter() - started)
        os.close(raw_fd)
    logged, rawed = (statistics.median(samples[k]) * 1e6 for k in ("log", "raw"))
    before = statistics.median(samples["before"]) * 1e6 if samples["before"] else None
    return logged, rawed, before


def log_rows(before_rev: str = LOG_BEFORE_REV) -> list[Row]:
    """The EventLog.log rows: today's cost, and the cost before issue 15 (when git can
    show ``before_rev``), each against a raw write+fsync of the same bytes measured in
    the same rounds."""
    logged_us, raw_us, before_us = log_cost(before_rev=before_rev)
    raw_name = "raw write+fsync of the same bytes"
    rows = [
        Row(
            "EventLog.log (median)",
            logged_us,
            "us",
            raw_name,
            raw_us,
            higher_is_better=False,
            target="<= 2.2x",
            met=logged_us <= 2.2 * raw_us,
        )
    ]
    if before_us is not None:
        rows.append(
            Row(
                f"EventLog.log at {before_rev[:8]}, before issue 15 (pending copy fsynced too)",
                before_us,
                "us",
                raw_name,
                raw_us,
                higher_is_better=False,
            )
        )
    return rows


# -- 5. faultfs against pyfakefs and the real file system -------------------------------


def _fs_workload(root: str, iterations: int = 100) -> int:
    """An fsynced append log plus atomic JSON rewrites; returns the os calls made."""
    calls = 1
    log = os.path.join(root, "events.jsonl")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for i in range(iterations):
        os.write(fd, json.dumps({"n": i, "kind": "event"}).encode() + b"\n")
        os.fsync(fd)
        calls += 2
        if i % 10 == 0:
            tmp = os.path.join(root, "state.json.tmp")
            tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(tfd, json.dumps({"last": i}).encode())
            os.fsync(tfd)
            os.close(tfd)
            os.replace(tmp, os.path.join(root, "state.json"))
            dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(dfd)
            os.close(dfd)
            os.stat(log)
            os.listdir(root)
            calls += 11
    os.close(fd)
    return calls + 1


def _median_rate(run: Callable[[int], int], rounds: int) -> float:
    """Calls per second, the median over ``rounds`` runs (not the best: that flatters)."""
    rates = []
    for index in range(rounds):
        started = time.perf_counter()
        calls = run(index)
        rates.append(calls / (time.perf_counter() - started))
    return statistics.median(rates)


def faultfs_rates(rounds: int = FAULTFS_ROUNDS) -> tuple[float, float | None, float]:
    """os calls per second on faultfs, on pyfakefs alone (None if absent) and on disk."""
    from faultfs import FaultFS

    def on_faultfs(index: int) -> int:
        with FaultFS("/faultfs-bench"):
            return _fs_workload("/faultfs-bench")

    faultfs_rate = _median_rate(on_faultfs, rounds)
    pyfakefs_rate: float | None = None
    try:
        from pyfakefs.fake_filesystem_unittest import Patcher
    except ImportError:
        pass
    else:
        with Patcher():

            def on_pyfakefs(index: int) -> int:
                os.makedirs(f"/pyfakefs-bench/{index}")
                return _fs_workload(f"/pyfakefs-bench/{index}")

            pyfakefs_rate = _median_rate(on_pyfakefs, rounds)
    with tempfile.TemporaryDirectory(prefix="substrat-realfs-", dir=os.getcwd()) as tmp:

        def on_disk(index: int) -> int:
            folder = Path(tmp) / str(index)
            folder.mkdir()
            return _fs_workload(str(folder))

        real_rate = _median_rate(on_disk, 3)
    return faultfs_rate, pyfakefs_rate, real_rate


# -- the table --------------------------------------------------------------------------------


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if unit == "MiB":
        return f"{value:,.0f} MiB"
    if value >= 100:
        text = f"{value:,.0f}"
    elif value >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".strip()


def _spread(value: float | None, spread: tuple[float, float] | None, unit: str) -> str:
    if value is None or spread is None:
        return _fmt(value, unit)
    return f"{_fmt(value, unit)} ({_fmt(spread[0])}-{_fmt(spread[1])})"


def render(rows: list[Row]) -> str:
    """The markdown table; a figure with a spread is a median (lowest-highest round)."""
    lines = [
        "| # | measure | figure | baseline (same run) | baseline | ratio | target | met |",
        "|---|---|---:|---|---:|---:|---|---|",
    ]
    for index, row in enumerate(rows, start=1):
        ratio = row.ratio
        met = "" if row.met is None else ("yes" if row.met else "**no**")
        lines.append(
            f"| {index} | {row.measure} | {_spread(row.figure, row.spread, row.unit)} | "
            f"{row.baseline_name} | {_spread(row.baseline, row.baseline_spread, row.unit)} | "
            f"{'n/a' if ratio is None else f'{ratio:.2f}x'} | {row.target} | {met} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="substrat's benchmark table (issue 9)")
    parser.add_argument("--baseline-rev", default=BASELINE_REV)
    parser.add_argument("--no-baseline", action="store_true", help="skip the old-revision runs")
    parser.add_argument(
        "--scale",
        type=int,
        nargs="*",
        default=[10_000, 100_000, 1_000_000],
        help="event counts of the recovery growth rows (agents of 100 events each)",
    )
    parser.add_argument("--no-single-agent", action="store_true")
    parser.add_argument(
        "--log-only",
        action="store_true",
        help="only the EventLog.log rows (now and before issue 15; seconds, not minutes)",
    )
    parser.add_argument(
        "--rounds", type=int, default=FUZZ_ROUNDS, help="interleaved rounds of the fuzzing rows"
    )
    parser.add_argument(
        "--no-checkpoints", action="store_true", help="skip the rows of oracle.bench_checkpoints"
    )
    args = parser.parse_args(argv)
    if args.log_only:
        print(render(log_rows()))
        return 0
    from oracle.bench_scale import scale_rows

    rows: list[Row] = []
    base = None if args.no_baseline else args.baseline_rev
    short = (base or "")[:8]

    def versus(function: str) -> float | None:
        return None if base is None else on_revision(base, function)

    # The fuzzing rows: interleaved rounds, each figure with its same-run baselines.
    rates = median_rounds(
        {
            "fuzz": fuzz_cycles,
            "hyp": hypothesis_cycles,
            "fuzz_base": lambda: versus("fuzz_cycles"),
            "hyp_base": lambda: versus("hypothesis_cycles"),
            "life": lifecycle_examples,
            "life_disk": lifecycle_on_disk,
        },
        args.rounds,
    )

    def fuzz_row(
        measure: str, figure: str, baseline_name: str, baseline: str | float | None, **kw: Any
    ) -> Row:
        got = rates[figure]
        assert got is not None, f"{figure} has no figure"
        base_got = rates[baseline] if isinstance(baseline, str) else None
        return Row(
            measure,
            got[0],
            "/s",
            baseline_name,
            base_got[0] if base_got else (baseline if isinstance(baseline, float) else None),
            spread=got[1:],
            baseline_spread=base_got[1:] if base_got else None,
            **kw,
        )

    fuzz, hyp, life = (rates[k][0] for k in ("fuzz", "hyp", "life"))  # type: ignore[index]
    rows.append(
        fuzz_row(
            "crash fuzzer workload: crash-recover-check cycles/s (1 core)",
            "fuzz",
            f"same at {short}",
            "fuzz_base",
            target=">= 400/s",
            met=fuzz >= 400,
        )
    )
    rows.append(
        fuzz_row(
            "the same inside Hypothesis (CrashRecoveryMachine, all rules)",
            "hyp",
            f"same at {short}",
            "hyp_base",
        )
    )
    rows.append(
        fuzz_row(
            "the same inside Hypothesis",
            "hyp",
            "the workload alone (row 1)",
            "fuzz",
            target=">= 0.5x",
            met=hyp >= 0.5 * fuzz,
        )
    )
    rows.append(
        fuzz_row(
            "the same inside Hypothesis",
            "hyp",
            "origin's persistence-only crash fuzzer (cited)",
            ORIGIN_PERSISTENCE_FUZZER,
            target=">= 340/s",
            met=hyp >= 340,
        )
    )
    rows.append(
        fuzz_row(
            "lifecycle fuzzer on faultfs: examples/s (30 steps, 1 core)",
            "life",
            "the same on a real directory",
            "life_disk",
        )
    )
    rows.append(
        fuzz_row(
            "lifecycle fuzzer on faultfs: examples/s (30 steps, 1 core)",
            "life",
            "origin's lifecycle fuzzer (cited)",
            ORIGIN_LIFECYCLE_FUZZER,
            target=">= 125/s",
            met=life >= 125,
        )
    )
    swept = sweep_rate()
    rows.append(
        Row(
            "exhaustive sweep: crash states checked/s (posix, 3 scenarios)",
            swept,
            "/s",
            f"same at {short}",
            versus("sweep_rate"),
            target=">= 2,000/s",
            met=swept >= 2000,
        )
    )
    rows.extend(scale_rows(args.scale, single_agent=not args.no_single_agent))
    rows.extend(log_rows())
    if not args.no_checkpoints:
        from oracle.bench_checkpoints import checkpoint_rows

        rows.extend(checkpoint_rows())
    faultfs_rate, pyfakefs_rate, real_rate = faultfs_rates()
    rows.append(Row("faultfs os calls/s", faultfs_rate, "/s", "pyfakefs alone", pyfakefs_rate))
    rows.append(
        Row("faultfs os calls/s", faultfs_rate, "/s", "real file system (fsync)", real_rate)
    )
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
