"""Calls per step of the lifecycle fuzzer: Python calls, C calls and faultfs calls by kind.

``python -m oracle.bench_step_calls [--examples N] [--json FILE]`` runs the bench's
examples of the lifecycle fuzzer (``oracle.bench_fuzz.run_seeded``: seed 1717, 30
steps) under :func:`sys.setprofile` and prints, per kind of step (each operation,
``reopen`` told apart as a clean close and a kill, the after-step checks, the
teardown with what it calls), how many times it ran and the calls it made each
time: Python calls, C calls, and the faultfs calls (``faultfs._syscalls``:
opens, reads, writes, fsyncs, renames, stats, listings) by kind.

Counts, not times: the same examples make the same calls in every run of a
tree, so two trees compare exactly on a loaded machine (docs/benchmarks.md,
"Fourteenth pass: the lifecycle fuzzer's operations"). Run each tree in its own
process with ``PYTHONPATH=<tree> PYTHONSAFEPATH=1 PYTHONHASHSEED=0`` (see
:mod:`oracle.bench_calls`, the crash fuzzer's counterpart, per part of a cycle).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

STEPS = (
    "create_root",
    "spawn_child",
    "run_turn",
    "send_message",
    "broadcast",
    "terminate_leaf",
    "terminate_cascade",
    "run_pending",
    "evict",
    "reopen",
    "check_all",
    "teardown",
)
"""The machine's methods counted."""
FAULTFS_CALLS = frozenset(
    {
        *("open", "close", "read", "pread", "write", "pwrite", "lseek", "ftruncate"),
        *("truncate", "fsync", "fstat", "flock", "stat", "listdir", "scandir", "mkdir"),
        *("rmdir", "unlink", "link", "rename", "chmod", "fchmod", "utime", "exists"),
    }
)
DURABLE_CALLS = frozenset(("write", "pwrite", "fsync", "rename", "mkdir", "unlink", "ftruncate"))
"""The faultfs calls that change what a crash leaves (the rest open, read and look)."""
TEARDOWN = "teardown"


@dataclass
class StepCalls:
    """What one kind of step called, summed over the run."""

    times: int = 0
    python: int = 0
    c: int = 0
    faultfs: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.times, "py": self.python, "c": self.c, "sys": dict(self.faultfs)}


def _label(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    if name != "reopen":
        return name
    return "reopen_crash" if kwargs.get("crash", args[0] if args else False) else "reopen_clean"


@contextmanager
def counting(machine: type) -> Iterator[dict[str, StepCalls]]:
    """Count the calls of each step of ``machine`` run inside the block (a step called
    by the teardown counts as the teardown's)."""
    steps: dict[str, StepCalls] = {}
    stack: list[StepCalls] = []
    saved = {name: machine.__dict__[name] for name in STEPS if name in machine.__dict__}

    def wrap(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            inner = not stack or stack[-1] is not steps.get(TEARDOWN)
            if inner:
                stack.append(steps.setdefault(_label(name, args, kwargs), StepCalls()))
                stack[-1].times += 1
            try:
                return method(self, *args, **kwargs)
            finally:
                if inner:
                    stack.pop()

        return counted

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if not stack:
            return
        step = stack[-1]
        if event == "call":
            step.python += 1
            code = frame.f_code
            if code.co_name in FAULTFS_CALLS and code.co_filename.endswith("_syscalls.py"):
                step.faultfs[code.co_name] += 1
        elif event == "c_call":
            step.c += 1

    for name, method in saved.items():
        setattr(machine, name, wrap(name, method))
    sys.setprofile(profile)
    try:
        yield steps
    finally:
        sys.setprofile(None)
        for name, method in saved.items():
            setattr(machine, name, method)


def count_lifecycle(examples: int = 100, steps: int = 30) -> dict[str, StepCalls]:
    """The calls per kind of step of the lifecycle fuzzer's seeded examples (after three
    unmeasured ones: imports and first-use caches are no step's cost)."""
    from oracle.bench_fuzz import run_seeded
    from oracle.bench_profile import WARM_UP_EXAMPLES
    from oracle.lifecycle import LifecycleMachine

    run_seeded(LifecycleMachine, WARM_UP_EXAMPLES, steps, 0)
    with counting(LifecycleMachine) as counted:
        run_seeded(LifecycleMachine, examples, steps)
    return counted


def render(counted: dict[str, StepCalls]) -> str:
    lines = [
        "| step | times | Python calls each | C calls each | faultfs calls each | durable each |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, step in sorted(counted.items(), key=lambda kv: -(kv[1].python + kv[1].c)):
        n = max(step.times, 1)
        durable = sum(v for k, v in step.faultfs.items() if k in DURABLE_CALLS)
        lines.append(
            f"| {label} | {step.times} | {step.python / n:.0f} | {step.c / n:.0f} | "
            f"{sum(step.faultfs.values()) / n:.1f} | {durable / n:.1f} |"
        )
    python = sum(s.python for s in counted.values())
    c = sum(s.c for s in counted.values())
    faultfs = sum(sum(s.faultfs.values()) for s in counted.values())
    lines.append(f"\ntotal: {python:,} Python calls, {c:,} C calls, {faultfs:,} faultfs calls")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="calls per step of the lifecycle fuzzer")
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", metavar="FILE", help="also write the counts here")
    args = parser.parse_args(argv)
    counted = count_lifecycle(args.examples, args.steps)
    print(render(counted))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({k: v.to_dict() for k, v in counted.items()}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
