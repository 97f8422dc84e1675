"""The fuzzing rows of the benchmark table: crash-recover-check cycles, lifecycle examples,
sweep states, each per CPU second of one process.

The workload functions here import nothing of the project at module level:
:func:`on_revision` loads this file beside an old revision's ``substrat``,
``oracle`` and ``faultfs`` and calls one of them there, so they measure the old
code with today's measuring code.
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from oracle.bench_origin import Origin
    from oracle.bench_table import Row

BASELINE_REV = "1fa8a4582ed8ce7b8ef6d09e52c926ccf5ceec18"
"""main just before the issue-9 optimisations (orjson, one read per log at recovery, ...)."""
FUZZ_EPISODES = 20
FUZZ_STEPS = 30
HYPOTHESIS_EXAMPLES = 100
LIFECYCLE_EXAMPLES = 100
FUZZ_ROUNDS = 3
BENCH_SEED = 1717
WARM_UP_EXAMPLES = 3
"""Unmeasured examples a fuzzer row runs first, on our side as on the origin's
(oracle.bench_origin): Hypothesis's first-run costs and imports are not the fuzzer's."""
"""The fuzzing rows' Hypothesis seed: the same examples for every revision compared."""
"""Interleaved rounds of each fuzzing row and its baselines; the table shows the median."""
ORIGIN_PERSISTENCE_FUZZER = 342.0
"""Crash-recover-check cycles per CPU s of the origin's persistence-only crash fuzzer
(Hardcode84/2, measured on this machine for issue 17; its whole-orchestrator fuzzer: 13.8)."""
ORIGIN_LIFECYCLE_FUZZER = 85.0
"""Examples per CPU s of the origin's lifecycle fuzzer, 30 steps (measured here, issue 17)."""
OPENAI_EXAMPLES = 20
CLI_RUNS = 5
SWEEP_SCENARIOS = ("roots", "stranded reply", "messages both ways")


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


def hypothesis_cycles(examples: int = HYPOTHESIS_EXAMPLES, steps: int = FUZZ_STEPS) -> float:
    """The same, inside the Hypothesis state machine (engine, other rules and invariants),
    ``steps`` steps an example (the campaign's 30; :func:`hypothesis_cycles_50`: the
    origin's shape)."""
    from oracle.harness import CrashHarness
    from oracle.machines import CrashRecoveryMachine

    count = [0]
    original = CrashHarness.crash_and_recover

    def counted(self: CrashHarness, *args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return original(self, *args, **kwargs)

    run_seeded(CrashRecoveryMachine, WARM_UP_EXAMPLES, steps)
    CrashHarness.crash_and_recover = counted  # type: ignore[method-assign]
    started = time.process_time()
    try:
        run_seeded(CrashRecoveryMachine, examples, steps)
    finally:
        CrashHarness.crash_and_recover = original  # type: ignore[method-assign]
    return count[0] / (time.process_time() - started)


def hypothesis_cycles_50(examples: int = HYPOTHESIS_EXAMPLES) -> float:
    """:func:`hypothesis_cycles` on the origin crash fuzzer's example shape, 50 steps
    (a measurement, not the campaign's step count): longer examples share the engine's
    per-example cost among more cycles, on both sides of the ratio."""
    from oracle.bench_origin import ORIGIN_CRASH_STEPS

    return hypothesis_cycles(examples, ORIGIN_CRASH_STEPS)


def run_seeded(machine: Any, examples: int, steps: int, seed: int = BENCH_SEED) -> None:
    """Run a state machine's test case on the examples of a fixed seed.

    A fixed seed, not ``derandomize``: a derandomized run seeds itself from a
    digest of the machine's source, so any edit of the machine would measure
    other examples than the revision it is compared with.
    """
    from hypothesis import HealthCheck, settings
    from hypothesis import seed as fixed_seed

    test = fixed_seed(seed)(machine).TestCase
    test.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    test("runTest").runTest()


def lifecycle_examples(on_disk: bool = False, examples: int = LIFECYCLE_EXAMPLES) -> float:
    """Examples per CPU second of the lifecycle fuzzer (30 steps), on faultfs or a real disk."""
    from oracle.lifecycle import LifecycleMachine, OnDiskLifecycleMachine

    machine = OnDiskLifecycleMachine if on_disk else LifecycleMachine
    run_seeded(machine, WARM_UP_EXAMPLES, 30)
    started = time.process_time()
    run_seeded(machine, examples, 30)
    return examples / (time.process_time() - started)


def lifecycle_on_disk() -> float:
    return lifecycle_examples(on_disk=True)


def lifecycle_engine_only(examples: int = LIFECYCLE_EXAMPLES) -> float:
    """Examples per CPU second of the lifecycle machine's rules with empty bodies
    (:func:`oracle.engine_floor.engine_only`): the engine's own cost, a ceiling."""
    from oracle.engine_floor import engine_only
    from oracle.lifecycle import LifecycleMachine

    started = time.process_time()
    run_seeded(engine_only(LifecycleMachine), examples, 30)
    return examples / (time.process_time() - started)


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


OPEN_SCENARIOS = ("roots", "terminations", "checkpoints and compaction")
"""Small roots for :func:`open_calls`: two roots, a tree with terminations, checkpoints."""
OPEN_CRASH_POINTS = 12
OPEN_REPEATS = 3


def open_calls(
    names: tuple[str, ...] = OPEN_SCENARIOS,
    points: int = OPEN_CRASH_POINTS,
    repeats: int = OPEN_REPEATS,
) -> float:
    """``Orchestrator.open`` calls per CPU second on small roots, as the fuzzers recover them.

    For each scenario, ``points`` crash points spread over its boundaries (posix
    profile); each crashed disk gives one image per crash mode, and each image is
    opened ``repeats`` times, each time a fresh copy of it (a fresh orchestrator,
    faultfs active, as ``CrashHarness`` opens one). Only the opens are timed, not
    the steps or the images, and each image counts with its cheapest open: what
    the other processes of a shared machine add to one open is left out.
    """
    from faultfs import MODES
    from oracle.harness import CrashHarness
    from oracle.sweep import SCENARIOS, count_boundaries

    CrashHarness().close()  # imports and faultfs's first activation: not an open's cost
    opened, spent = 0, 0.0
    for name in names:
        scenario = SCENARIOS[name]
        boundaries = count_boundaries(scenario, "posix")
        for point in range(points):
            harness = CrashHarness(slots=scenario.slots, checkpoints=scenario.checkpoints)
            harness.run_steps(list(scenario.steps), crash_at=1 + point * boundaries // points)
            for seed, mode in enumerate(MODES):
                times = []
                for _ in range(repeats):
                    image = harness.fs.crash_image(mode, seed=seed)
                    started = time.process_time()
                    harness._orchestrator_on(image)
                    times.append(time.process_time() - started)
                spent += min(times)
                opened += 1
            harness.close()
    return opened / spent


def openai_examples(examples: int = OPENAI_EXAMPLES) -> float:
    """Examples per CPU second of the OpenAI crash machine (tests/stress/test_crash_fuzz.py:
    every agent on the openai provider over loopback HTTP), derandomized, 30 steps, after
    3 unmeasured warm-up examples; the server's threads are in this process and count."""
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    import tests.stress.test_crash_fuzz as fuzz
    from tests.support.chat_server import ChatServer
    from tests.support.directive_chat import directive_responder

    machine = fuzz.OpenAICrashRecoveryMachine
    profile = settings(
        max_examples=3,
        stateful_step_count=30,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    with ChatServer(directive_responder) as server:
        machine.server = server
        run_state_machine_as_test(machine, settings=profile)
        started = time.process_time()
        run_state_machine_as_test(machine, settings=settings(profile, max_examples=examples))
        spent = time.process_time() - started
    return examples / spent


def cli_commands(runs: int = CLI_RUNS) -> float:
    """``substrat agent list --json`` processes per CPU second (the median of ``runs``; on
    a directory that is no root, so the command's own work is a few checks): what every
    CLI test pays per call, mostly imports."""
    import resource
    import statistics

    import substrat

    tree = str(Path(substrat.__file__).resolve().parents[1])
    code = "import sys; from substrat.cli import main; sys.exit(main())"
    spent = []
    with tempfile.TemporaryDirectory(prefix="substrat-cli-bench-") as empty:
        argv = [sys.executable, "-c", code, "agent", "list", "--json", "--no-autostart"]
        for _ in range(runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(
                [*argv, "--root", empty],
                capture_output=True,
                env={**os.environ, "PYTHONPATH": tree},
                cwd=empty,
            )
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            spent.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return 1 / statistics.median(spent)


_UNAVAILABLE: dict[tuple[str, str], str] = {}
"""(revision, function) -> why it cannot run there: said once, not tried again each round."""


def in_fresh_process(function: str) -> float:
    """Run ``function`` of this file in a new interpreter on this tree, as the baselines
    (:func:`on_revision`) and the origin's rows run: each figure from a fresh heap.

    Measured in the bench's own process, ours came after every other row's objects and
    collections, the other side of each ratio did not: the crash fuzzer at 30 steps read
    0.91x the origin in the bench and 1.13x in fresh processes, alternating (load 15-22).
    """
    top = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", f"import oracle.bench_fuzz as b; print(b.{function}())"],
        capture_output=True,
        text=True,
        cwd=top,  # this tree first on sys.path, as the bench itself runs
    )
    if done.returncode != 0:
        raise RuntimeError(f"{function} failed in a fresh process:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def on_revision(rev: str, function: str) -> float | None:
    """Run ``function`` of this file against substrat/oracle/faultfs/tests as of ``rev``.

    None (the row shows n/a) when it fails there; a function whose code the revision
    does not have yet (an import error) is reported in one line once and not run again.
    """
    if (rev, function) in _UNAVAILABLE:
        return None
    top = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="substrat-baseline-") as tmp:
        archive = subprocess.run(
            # tests: the OpenAI crash machine and its loopback server live there.
            ["git", "-C", str(top), "archive", rev, "substrat", "oracle", "faultfs", "tests"],
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
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        missing = re.match(r"(?:ModuleNotFoundError|ImportError): (.*)", last)
        if missing:
            # E.g. the lifecycle machine did not exist yet at ``rev``.
            detail = re.sub(r" \(/[^)]*\)", "", missing.group(1))  # no temporary paths
            why = f"{function} at {rev[:8]}: n/a, the revision predates it ({detail})"
            _UNAVAILABLE[rev, function] = why
            print(why, file=sys.stderr)
        else:
            print(f"{function} at {rev[:8]} failed: {last}", file=sys.stderr)
        return None
    return float(done.stdout.strip().splitlines()[-1])


def fuzz_rows(
    base: str | None, rounds: int = FUZZ_ROUNDS, origin: Origin | None = None
) -> list[Row]:
    """The fuzzing rows, from ``rounds`` interleaved rounds of each figure and its
    baselines: the same code at ``base`` (None: no such rows' baselines), the crash
    fuzzer's workload alone, the lifecycle fuzzer on a real directory, the origin's
    fuzzers (measured in the same rounds when ``origin`` is given, else cited constants)."""
    from oracle.bench_origin import (
        ORIGIN_CRASH_STEPS,
        after,
        origin_rate,
        print_round_ratios,
        recorded,
    )
    from oracle.bench_table import Row, median_rounds

    short = (base or "")[:8]

    def versus(function: str) -> float | None:
        return None if base is None else on_revision(base, function)

    measures: dict[str, Callable[[], float | None]] = {
        "fuzz": lambda: in_fresh_process("fuzz_cycles"),
        "hyp": lambda: in_fresh_process("hypothesis_cycles"),
        "fuzz_base": lambda: versus("fuzz_cycles"),
        "hyp_base": lambda: versus("hypothesis_cycles"),
        "life": lambda: in_fresh_process("lifecycle_examples"),
        "life_base": lambda: versus("lifecycle_examples"),
        "life_disk": lambda: in_fresh_process("lifecycle_on_disk"),
        "life_engine": lambda: in_fresh_process("lifecycle_engine_only"),
    }
    if origin is not None:
        # Each right after ours: the same minute's load on both sides of the ratio;
        # ours at the origin's 50 steps too, so each shape has its same-run ratio.
        measures = after(measures, "hyp", "hyp50", lambda: in_fresh_process("hypothesis_cycles_50"))
        measures = after(
            measures,
            "hyp50",
            "origin_crash",
            lambda: origin_rate(
                origin, "crash", HYPOTHESIS_EXAMPLES, ORIGIN_CRASH_STEPS, BENCH_SEED
            ),
        )
        measures = after(
            measures,
            "life",
            "origin_life",
            lambda: origin_rate(origin, "lifecycle", LIFECYCLE_EXAMPLES, 30, BENCH_SEED),
        )
    seen: dict[str, list[float | None]] = {}
    rates = median_rounds({k: recorded(seen, k, f) for k, f in measures.items()}, rounds)
    if origin is not None:
        print_round_ratios(
            seen,
            [("hyp", "origin_crash"), ("hyp50", "origin_crash"), ("life", "origin_life")],
        )

    def row(measure: str, figure: str, baseline_name: str, baseline: str | float, **kw: Any) -> Row:
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
    crash = "crash fuzzer workload: crash-recover-check cycles/s (1 core)"
    inside = "the same inside Hypothesis (CrashRecoveryMachine, all rules)"
    lifecycle = "lifecycle fuzzer on faultfs: examples/s (30 steps, 1 core)"
    origin_rows = []
    if origin is None:
        how = "cited, issue 17; `--origin PATH` measures it in this run"
        origin_rows = [
            row(
                inside,
                "hyp",
                f"origin's persistence-only crash fuzzer ({how})",
                ORIGIN_PERSISTENCE_FUZZER,
                target=">= 340/s",
                met=hyp >= 340,
            ),
            row(
                lifecycle,
                "life",
                f"origin's lifecycle fuzzer ({how})",
                ORIGIN_LIFECYCLE_FUZZER,
                target=">= 125/s",
                met=life >= 125,
            ),
        ]
    else:
        crash_origin, life_origin = rates["origin_crash"], rates["origin_life"]
        cited_crash = f"{ORIGIN_PERSISTENCE_FUZZER:.0f}"
        versus_origin = f"origin's persistence-only crash fuzzer, {ORIGIN_CRASH_STEPS} steps"
        hyp50 = rates["hyp50"]
        assert hyp50 is not None, "hyp50 has no figure"
        origin_rows = [
            row(
                inside,
                "hyp",
                f"{versus_origin}, this run (cited: {cited_crash})",
                "origin_crash",
                target=">= 0.99x (340/342)",
                met=None if crash_origin is None else hyp >= 340 / 342 * crash_origin[0],
            ),
            row(
                f"the same at the origin's {ORIGIN_CRASH_STEPS} steps (a measurement only)",
                "hyp50",
                f"{versus_origin}, this run",
                "origin_crash",
                target=">= 0.99x",
                met=None if crash_origin is None else hyp50[0] >= 340 / 342 * crash_origin[0],
            ),
            row(
                lifecycle,
                "life",
                f"origin's lifecycle fuzzer, this run (cited: {ORIGIN_LIFECYCLE_FUZZER:.0f})",
                "origin_life",
                target=">= 1.5x",
                met=None if life_origin is None else life >= 1.5 * life_origin[0],
            ),
        ]
    return [
        row(crash, "fuzz", f"same at {short}", "fuzz_base", target=">= 400/s", met=fuzz >= 400),
        row(inside, "hyp", f"same at {short}", "hyp_base"),
        row(
            inside,
            "hyp",
            "the workload alone (row 1)",
            "fuzz",
            target=">= 0.5x",
            met=hyp >= 0.5 * fuzz,
        ),
        *origin_rows[:-1],
        row(lifecycle, "life", f"same at {short}", "life_base"),
        row(lifecycle, "life", "the same on a real directory", "life_disk"),
        row(lifecycle, "life", "its rules with empty bodies: the engine alone", "life_engine"),
        origin_rows[-1],
    ]


def open_row(base: str | None, rounds: int = FUZZ_ROUNDS) -> Row:
    """``Orchestrator.open`` on small roots (:func:`open_calls`), against the same at
    ``base``, in interleaved rounds (one process per figure each round)."""
    from oracle.bench_table import Row, median_rounds

    rates = median_rounds(
        {
            "open": open_calls,
            "base": lambda: None if base is None else on_revision(base, "open_calls"),
        },
        rounds,
    )
    got, against = rates["open"], rates["base"]
    assert got is not None, "open_calls has no figure"
    return Row(
        "Orchestrator.open on small roots: calls/s (144 images, best of 3 each, 1 core)",
        got[0],
        "/s",
        f"same at {(base or '')[:8]}",
        against[0] if against else None,
        spread=got[1:],
        baseline_spread=against[1:] if against else None,
    )


def sweep_row(base: str | None) -> Row:
    """States the exhaustive sweep checks per CPU second, against the same at ``base``."""
    from oracle.bench_table import Row

    swept = sweep_rate()
    return Row(
        "exhaustive sweep: crash states checked/s (posix, 3 scenarios)",
        swept,
        "/s",
        f"same at {(base or '')[:8]}",
        None if base is None else on_revision(base, "sweep_rate"),
        target=">= 2,000/s",
        met=swept >= 2000,
    )


def _repository_tests() -> bool:
    """Whether the repository's ``tests`` package (not some other) can be imported."""
    try:
        return importlib.util.find_spec("tests.support.chat_server") is not None
    except ModuleNotFoundError:
        return False


def campaign_rows(base: str | None, rounds: int = FUZZ_ROUNDS) -> list[Row]:
    """What the main job's slowest items pay per example or call, against the same at
    ``base`` (interleaved rounds): the OpenAI crash machine, and a CLI process."""
    from oracle.bench_table import Row, median_rounds

    short = (base or "")[:8]

    def versus(function: str) -> float | None:
        return None if base is None else on_revision(base, function)

    measures = {
        "cli": cli_commands,
        "cli_base": lambda: versus("cli_commands"),
    }
    rows_wanted = [("cli", "CLI: `substrat agent list --json` processes/s (CPU, median of 5)")]
    if not _repository_tests():
        # the machine and its loopback server live in the repository's tests/
        print(
            "oracle.bench: the OpenAI crash machine row needs the repository's tests/ "
            "package: run it from a checkout of substrat (skipped)",
            file=sys.stderr,
        )
    else:
        measures["openai"] = openai_examples
        measures["openai_base"] = lambda: versus("openai_examples")
        rows_wanted.insert(0, ("openai", "OpenAI crash machine: examples/s (30 steps, 1 core)"))
    rates = median_rounds(measures, rounds)
    rows = []
    for key, measure in rows_wanted:
        got, against = rates[key], rates[f"{key}_base"]
        assert got is not None, f"{key} has no figure"
        rows.append(
            Row(
                measure,
                got[0],
                "/s",
                f"same at {short}",
                against[0] if against else None,
                spread=got[1:],
                baseline_spread=against[1:] if against else None,
            )
        )
    return rows
