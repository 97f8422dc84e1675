"""Where a fuzzer's CPU time goes: exclusive CPU seconds per named part of the run.

``python -m oracle.bench_profile crash`` (or ``lifecycle [--on-disk]``) runs a fuzzer on a
fixed-seed Hypothesis run and prints one markdown table: the CPU
seconds spent in each part (the Hypothesis engine, the draws inside rules,
harness set-up and teardown, the steps, the after-step check, crash images,
recovery, the check after recovery, model copies), as a share of the whole
and per crash-recover-check cycle (or per example).

How it measures: each part is a set of functions (:class:`Hook`), wrapped for
the run with a timer that reads ``time.process_time``. Time is exclusive: a
hooked function called inside another one is charged to its own part and
taken out of the caller's. What no hook claims (rule choice, example
generation, span bookkeeping, the shrinker, the machine's own glue) is the
engine's. The timers (two ``process_time`` calls per hooked call) are
charged to the parts they wrap, so the hooked run is a little slower than an
unhooked one; compare shares and per-cycle times between runs of this tool,
rates with ``oracle.bench``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

ENGINE = "Hypothesis engine: rule choice, generation, bookkeeping"
DEFAULT_EXAMPLES = 100
DEFAULT_STEPS = 30
WARM_UP_EXAMPLES = 3
"""Run first and not measured: imports and first-use caches are not a cycle's cost."""


@dataclass(frozen=True)
class Hook:
    """Charge the calls of ``owner.attribute`` to ``part``.

    ``inherit``: when called inside another hooked call, charge the caller's
    part instead (an orchestrator opened while a harness is set up is set-up,
    the same call after a crash is recovery).
    """

    part: str
    owner: Any
    attribute: str
    inherit: bool = False


@dataclass
class Breakdown:
    """Exclusive CPU seconds per part, and the run's total CPU seconds."""

    parts: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    total_s: float = 0.0

    def with_engine(self) -> dict[str, float]:
        """The parts plus the engine's share (the total minus every part)."""
        out = dict(self.parts)
        out[ENGINE] = max(0.0, self.total_s - sum(self.parts.values()))
        return out


class _Timer:
    def __init__(self) -> None:
        self.stack: list[list[Any]] = []  # [part, start, time charged to callees]
        self.result = Breakdown()

    def wrap(self, hook: Hook, function: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.process_time
        stack = self.stack
        parts = self.result.parts
        calls = self.result.calls

        @wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            part = stack[-1][0] if hook.inherit and stack else hook.part
            frame: list[Any] = [part, clock(), 0.0]
            stack.append(frame)
            try:
                return function(*args, **kwargs)
            finally:
                stack.pop()
                spent = clock() - frame[1]
                parts[part] = parts.get(part, 0.0) + spent - frame[2]
                calls[part] = calls.get(part, 0) + 1
                if stack:
                    stack[-1][2] += spent

        return timed


@contextmanager
def hooked(hooks: list[Hook]) -> Iterator[Breakdown]:
    """Wrap every hook's function while the block runs; the breakdown fills in as it goes."""
    timer = _Timer()
    saved: list[tuple[Any, str, Any]] = []
    for hook in hooks:
        original = hook.owner.__dict__[hook.attribute] if isinstance(hook.owner, type) else None
        current = getattr(hook.owner, hook.attribute)
        saved.append((hook.owner, hook.attribute, original if original is not None else current))
        setattr(hook.owner, hook.attribute, timer.wrap(hook, current))
    started = time.process_time()
    try:
        yield timer.result
    finally:
        timer.result.total_s = time.process_time() - started
        for owner, attribute, original in reversed(saved):
            setattr(owner, attribute, original)


def run_machine(machine: Any, examples: int, steps: int) -> None:
    """Run a state machine's test case on a fixed seed's examples (see ``run_seeded``)."""
    from oracle.bench_fuzz import run_seeded

    run_seeded(machine, examples, steps)


def draw_hooks() -> list[Hook]:
    from hypothesis.strategies._internal.core import DataObject

    from oracle import draws, lifecycle, machines

    part = "Hypothesis draws inside rules"
    # oracle.draws goes round DataObject.draw (see there); the machines hold their own names
    return [
        Hook(part, DataObject, "draw"),
        Hook(part, draws, "draw"),
        *(Hook(part, machines, name) for name in ("pick", "integer", "flag")),
        *(Hook(part, lifecycle, name) for name in ("pick", "flag")),
    ]


def crash_hooks() -> list[Hook]:
    """The crash fuzzer's parts (oracle.machines, oracle.harness)."""
    from faultfs import FaultFS
    from oracle import harness, machines
    from oracle.model import Model, ModelState

    hooks = [
        Hook("harness set-up and teardown", harness.CrashHarness, "__init__"),
        Hook("harness set-up and teardown", harness.CrashHarness, "close"),
        Hook("the steps (orchestrator on faultfs)", harness.CrashHarness, "run"),
        Hook("the steps (orchestrator on faultfs)", harness.CrashHarness, "run_failing_fsyncs"),
        Hook("crash image (faultfs)", FaultFS, "crash_image"),
        Hook("recovery (Orchestrator.open on the image)", harness.CrashHarness, "_open_here", True),
        Hook("the check after recovery", harness, "check_recovery"),
        Hook("model copies", ModelState, "copy"),
        Hook("model copies", Model, "copy"),
    ]
    # The after-step check: whatever the machine calls to observe and compare.
    for name in ("observe", "expected", "diff", "check_running"):
        if hasattr(machines, name):
            hooks.append(Hook("the after-step check", machines, name))
    if hasattr(harness.CrashHarness, "check_running"):
        hooks.append(Hook("the after-step check", harness.CrashHarness, "check_running"))
    return [*hooks, *draw_hooks()]


@contextmanager
def crash_cycles() -> Iterator[list[int]]:
    """Count the crash-recover-check cycles (``CrashHarness.crash_and_recover`` calls)
    run in the block: the one-item list's value."""
    from oracle.harness import CrashHarness

    cycles = [0]
    original = CrashHarness.crash_and_recover

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        cycles[0] += 1
        return original(self, *args, **kwargs)

    CrashHarness.crash_and_recover = counted  # type: ignore[method-assign]
    try:
        yield cycles
    finally:
        CrashHarness.crash_and_recover = original  # type: ignore[method-assign]


def profile_crash(examples: int = DEFAULT_EXAMPLES, steps: int = DEFAULT_STEPS) -> Breakdown:
    from oracle.machines import CrashRecoveryMachine

    with crash_cycles() as cycles, hooked(crash_hooks()) as result:
        run_machine(CrashRecoveryMachine, examples, steps)
    result.calls["cycles"] = cycles[0]
    return result


def warm_up(fuzzer: str, examples: int, steps: int) -> None:
    if examples < 1:
        return
    if fuzzer == "crash":
        from oracle.machines import CrashRecoveryMachine as machine
    else:
        from oracle.lifecycle import LifecycleMachine as machine  # type: ignore[assignment]
    run_machine(machine, examples, steps)


def render(title: str, result: Breakdown, unit: str, count: int) -> str:
    shares = result.with_engine()
    lines = [
        f"{title}: {result.total_s:.2f} CPU s, {count} {unit}s "
        f"({count / result.total_s:.1f} per CPU s)",
        "",
        f"| part | CPU s | share | ms per {unit} |",
        "|---|---:|---:|---:|",
    ]
    for part, spent in sorted(shares.items(), key=lambda kv: -kv[1]):
        lines.append(
            f"| {part} | {spent:.2f} | {100 * spent / result.total_s:.1f}% | "
            f"{1000 * spent / max(count, 1):.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="where a fuzzer's CPU time goes")
    parser.add_argument("fuzzer", choices=("crash", "lifecycle"))
    parser.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--warm-up", type=int, default=WARM_UP_EXAMPLES, metavar="EXAMPLES")
    parser.add_argument(
        "--on-disk", action="store_true", help="lifecycle: the real-directory machine"
    )
    args = parser.parse_args(argv)
    warm_up(args.fuzzer, args.warm_up, args.steps)
    if args.fuzzer == "crash":
        result = profile_crash(args.examples, args.steps)
        print(render("crash fuzzer", result, "cycle", result.calls["cycles"]))
    else:
        from oracle.lifecycle import LifecycleMachine, OnDiskLifecycleMachine

        machine = OnDiskLifecycleMachine if args.on_disk else LifecycleMachine
        result = profile_lifecycle(args.examples, args.steps, machine)
        title = "lifecycle fuzzer" + (" on a real directory" if args.on_disk else " on faultfs")
        print(render(title, result, "example", args.examples))
    return 0


def lifecycle_hooks(machine: type) -> list[Hook]:
    """The lifecycle fuzzer's parts: set-up, teardown, the checks, the operations."""
    hooks = [
        Hook("machine set-up (a root, an event loop, Orchestrator.open)", machine, "__init__"),
        Hook("teardown (the final restart and its checks)", machine, "teardown"),
        Hook("the operations (orchestrator calls)", machine, "run", True),
    ]
    # check_all, not the invariant that calls it: Hypothesis keeps its own
    # reference to each invariant, so a wrapper set on the class is not called.
    hooks.append(Hook("the after-step checks", machine, "check_all"))
    return [*hooks, *draw_hooks()]


def profile_lifecycle(
    examples: int = DEFAULT_EXAMPLES, steps: int = DEFAULT_STEPS, machine: Any = None
) -> Breakdown:
    """The lifecycle fuzzer's breakdown (``machine``: another class of it, e.g. on disk)."""
    if machine is None:
        from oracle.lifecycle import LifecycleMachine as machine
    with hooked(lifecycle_hooks(machine)) as result:
        run_machine(machine, examples, steps)
    return result


if __name__ == "__main__":
    sys.exit(main())
