"""The origin's fuzzers (Hardcode84/2) measured beside ours, in the same interleaved rounds.

Issue 17's targets are ratios against the origin Substrat's fuzzers: its
persistence-only crash fuzzer (``tests/stress/test_crash_fuzz.py``) and its
lifecycle fuzzer (``tests/stress/test_orchestrator_fuzz.py``). Our rates move by
25% with the machine's load, so a constant measured once in another session
says little; ``python -m oracle.bench --fuzz-only --origin PATH`` runs the
origin's two fuzzers in fresh processes of the origin's own interpreter
(``--origin-python``: it needs Python >= 3.12 and its package installed, e.g.
``pip install -e PATH hypothesis pytest``), pinned to one CPU, on our example
counts and seed (100 examples, seed 1717; 30 steps for the lifecycle fuzzer as
ours, the crash fuzzer's own 50: :data:`ORIGIN_CRASH_STEPS`), each right after
ours in every round.

What counts: an example of the lifecycle fuzzer, as ours; a crash-recover-check
cycle of the crash fuzzer is a crash rule whose operation did crash before it
completed (the rule then "reboots" the disk, recovers and checks). Its crash rules
called in all, crashed or not, are 4-5x as many.

This module imports nothing of the project's: :data:`PROBE` is the code the
origin's interpreter runs, in a checkout of the origin (its ``tests`` package
on the path, its ``substrat`` from its own install); of ours it loads only
``oracle/bench_fuzz.py`` by its path, for the settings ours run with
(:func:`oracle.bench_fuzz.run_seeded`, standard library at module level).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from oracle.bench_fuzz import WARM_UP_EXAMPLES

ORIGIN_REPOSITORY = "Hardcode84/2"
ORIGIN_CPU = 1
"""The CPU the origin's processes are pinned to (``taskset -c``); pin ours the same way."""
ORIGIN_CRASH_STEPS = 50
"""The origin's crash fuzzer runs its own ``stateful_step_count`` (50; ours 30): longer
examples share the engine's per-example cost among more cycles, 1.3-1.4x its rate at 30
steps here, so this is the harder comparison for ours (docs/benchmarks.md, thirteenth pass)."""

PROBE = r"""
import importlib.util, sys, time

kind, examples, steps, fixed, warm = sys.argv[1], *map(int, sys.argv[2:6])
spec = importlib.util.spec_from_file_location("bench_fuzz", sys.argv[6])
bench_fuzz = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_fuzz)
count = [0]
if kind == "crash":
    # A crash-recover-check cycle: a crash rule whose operation did crash; the
    # rule then thaws the disk ("reboot"), recovers and checks (thaw is called
    # there and nowhere else).
    from tests.stress import test_crash_fuzz as module
    from tests.stress.vfs import VirtualFS

    machine = module.CrashRecoveryMachine
    thaw = VirtualFS.thaw

    def counted(self):
        count[0] += 1
        return thaw(self)

    VirtualFS.thaw = counted
else:
    from tests.stress import test_orchestrator_fuzz as module

    machine = module.OrchestratorStateMachine


def run(n):
    # the same settings as ours: oracle.bench_fuzz.run_seeded, loaded from its file
    # (it imports only the standard library and, when called, Hypothesis)
    bench_fuzz.run_seeded(machine, n, steps, fixed)


if warm:
    run(warm)
count[0] = 0
started = time.process_time()
run(examples)
spent = time.process_time() - started
print((count[0] if kind == "crash" else examples) / spent)
"""


@dataclass(frozen=True)
class Origin:
    """Where the origin's checkout and interpreter are, and the CPU to pin to."""

    path: Path
    python: str
    cpu: int = ORIGIN_CPU

    def check(self) -> str | None:
        """Why the origin cannot be measured here (None: it can)."""
        for name in ("test_crash_fuzz.py", "test_orchestrator_fuzz.py"):
            if not (self.path / "tests" / "stress" / name).is_file():
                return f"{self.path} has no tests/stress/{name}: not a checkout of the origin"
        return None


def origin_rate(origin: Origin, kind: str, examples: int, steps: int, seed: int) -> float | None:
    """One fresh, pinned process of the origin's interpreter running one of its fuzzers:
    crash-recover-check cycles (``kind="crash"``) or examples (``"lifecycle"``) per CPU s.

    The process first runs :data:`WARM_UP_EXAMPLES` unmeasured examples (imports and
    Hypothesis's first-run costs are not the fuzzer's), then ``examples`` of ``seed``.
    None, with one line on stderr, when the run fails.
    """
    argv = [origin.python, "-c", PROBE, kind, str(examples), str(steps), str(seed)]
    argv += [str(WARM_UP_EXAMPLES), str(Path(__file__).with_name("bench_fuzz.py"))]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        ["taskset", "-c", str(origin.cpu), *argv],
        capture_output=True,
        text=True,
        cwd=origin.path,  # its tests package, not ours
        env=env,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        print(f"origin {kind} fuzzer failed: {last}", file=sys.stderr)
        return None
    return float(done.stdout.strip().splitlines()[-1])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--origin PATH``, ``--origin-python``, ``--origin-cpu`` (for :func:`from_arguments`)."""
    group = parser.add_argument_group(f"the origin ({ORIGIN_REPOSITORY}) beside ours")
    group.add_argument(
        "--origin",
        type=Path,
        metavar="PATH",
        help="a checkout of the origin: run its crash and lifecycle fuzzers in the same "
        "rounds as ours (fresh pinned processes) instead of citing its figures",
    )
    interpreter = "the interpreter with the origin installed (it needs Python >= 3.12)"
    group.add_argument("--origin-python", default="python3.12", help=interpreter)
    group.add_argument("--origin-cpu", type=int, default=ORIGIN_CPU, help="pin it to this CPU")


def from_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Origin | None:
    """The origin the arguments name (None without ``--origin``); a path that is no
    checkout of it is a usage error."""
    if args.origin is None:
        return None
    origin = Origin(args.origin.resolve(), args.origin_python, args.origin_cpu)
    problem = origin.check()
    if problem:
        parser.error(problem)
    print(f"origin: {origin_python_version(origin)} (Python, Hypothesis)", file=sys.stderr)
    return origin


def origin_python_version(origin: Origin) -> str:
    done = subprocess.run(
        [
            origin.python,
            "-c",
            "import sys, hypothesis; print(sys.version.split()[0], hypothesis.__version__)",
        ],
        capture_output=True,
        text=True,
        cwd=origin.path,
    )
    return done.stdout.strip() or "?"


def after(
    measures: dict[str, Callable[[], float | None]],
    key: str,
    name: str,
    function: Callable[[], float | None],
) -> dict[str, Callable[[], float | None]]:
    """``measures`` with ``name`` run right after ``key`` in each round."""
    out: dict[str, Callable[[], float | None]] = {}
    for k, f in measures.items():
        out[k] = f
        if k == key:
            out[name] = function
    return out


def recorded(
    seen: dict[str, list[float | None]], key: str, function: Callable[[], float | None]
) -> Callable[[], float | None]:
    def run() -> float | None:
        got = function()
        seen.setdefault(key, []).append(got)
        return got

    return run


def print_round_ratios(seen: dict[str, list[float | None]], pairs: list[tuple[str, str]]) -> None:
    """Each round's figures and ratio of ours to the origin's (stderr): the rows show
    medians, a ratio's spread over the rounds is here."""
    for ours, theirs in pairs:
        rounds = [
            f"{a:.1f}/{b:.1f} = {a / b:.2f}x" if a and b else "n/a"
            for a, b in zip(seen.get(ours, []), seen.get(theirs, []), strict=True)
        ]
        print(f"{ours} vs {theirs}, per round: " + "; ".join(rounds), file=sys.stderr)
