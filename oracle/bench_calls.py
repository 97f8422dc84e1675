"""Python calls per crash-recover-check cycle, per part of the crash fuzzer: the fair figure
on a loaded machine.

``python -m oracle.bench_calls --seed 1717 --seed 1`` runs the crash fuzzer on each seed's
fixed examples (``oracle.bench_fuzz.run_seeded``) and counts every Python call
(``call`` and ``c_call`` events of :func:`sys.setprofile`), charged to the part of the run
that :mod:`oracle.bench_profile`'s hooks say it is in; what no hook claims is the engine's.
The hooks' own wrappers are not counted. The same code on the same seeds makes the same
calls whatever else the machine runs, so two trees compare exactly where CPU rates, at
10-25% noise on a shared machine, cannot; run each tree in its own process with
``PYTHONPATH=<tree> PYTHONSAFEPATH=1 PYTHONHASHSEED=0`` (set iteration order moves a few
calls otherwise). The counting makes the run about ten times slower.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import wraps
from types import FrameType
from typing import Any

from oracle.bench_profile import (
    DEFAULT_EXAMPLES,
    DEFAULT_STEPS,
    ENGINE,
    WARM_UP_EXAMPLES,
    Hook,
    crash_cycles,
    crash_hooks,
)

ALL = "all"
CYCLES = "cycles"


@dataclass
class Counted:
    """Python calls per part, and the crash-recover-check cycles of the run."""

    calls: Counter[str] = field(default_factory=Counter)
    cycles: int = 0


@contextmanager
def counting(hooks: list[Hook]) -> Iterator[Counted]:
    """Count the calls made while the block runs, per hook part (see the module)."""
    result = Counted()
    parts: list[str] = []

    def wrap(hook: Hook, function: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(function)
        def charged(*args: Any, **kwargs: Any) -> Any:
            parts.append(parts[-1] if hook.inherit and parts else hook.part)
            try:
                return function(*args, **kwargs)
            finally:
                parts.pop()

        return charged

    own = wrap(Hook("", None, ""), lambda: None).__code__
    calls = result.calls

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if (event == "call" or event == "c_call") and frame.f_code is not own:
            calls[parts[-1] if parts else ENGINE] += 1

    saved: list[tuple[Any, str, Any]] = []
    for hook in hooks:
        owned = isinstance(hook.owner, type) and hook.attribute in hook.owner.__dict__
        current = getattr(hook.owner, hook.attribute)
        saved.append(
            (hook.owner, hook.attribute, hook.owner.__dict__[hook.attribute] if owned else current)
        )
        setattr(hook.owner, hook.attribute, wrap(hook, current))
    sys.setprofile(profile)
    try:
        yield result
    finally:
        sys.setprofile(None)
        for owner, attribute, original in reversed(saved):
            setattr(owner, attribute, original)
        result.calls[ALL] = sum(result.calls.values())


def count_crash(examples: int, steps: int, seed: int) -> Counted:
    """The crash fuzzer's calls on ``seed``'s examples."""
    from oracle.bench_fuzz import run_seeded
    from oracle.machines import CrashRecoveryMachine

    with crash_cycles() as cycles, counting(crash_hooks()) as result:
        run_seeded(CrashRecoveryMachine, examples, steps, seed)
    result.cycles = cycles[0]
    return result


def render(total: Counted, examples: int) -> str:
    lines = [
        f"{total.cycles} cycles in {examples} examples",
        "",
        "| part | calls per cycle | per example |",
        "|---|---:|---:|",
    ]
    for part, n in sorted(total.calls.items(), key=lambda kv: (kv[0] != ALL, -kv[1])):
        lines.append(f"| {part} | {n / max(total.cycles, 1):,.0f} | {n / examples:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Python calls per crash fuzzer cycle, per part")
    parser.add_argument("--seed", type=int, action="append", default=None, help="repeatable")
    parser.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args(argv)
    seeds = args.seed or [1717]
    from oracle.bench_fuzz import run_seeded
    from oracle.machines import CrashRecoveryMachine

    run_seeded(CrashRecoveryMachine, WARM_UP_EXAMPLES, args.steps, 0)  # imports, first-use caches
    total = Counted()
    for seed in seeds:
        counted = count_crash(args.examples, args.steps, seed)
        total.calls.update(counted.calls)
        total.cycles += counted.cycles
    print(f"seeds {', '.join(map(str, seeds))}: " + render(total, args.examples * len(seeds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
