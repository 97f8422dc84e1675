"""What the lifecycle fuzzer's faultfs calls are for: each call charged to its purpose.

``python -m oracle.bench_call_sites [--examples N]`` runs the bench's examples of the
lifecycle fuzzer (``oracle.bench_fuzz.run_seeded``: seed 1717, 30 steps, after three
unmeasured ones) and charges every faultfs call (``faultfs._syscalls``, as
:mod:`oracle.bench_step_calls` counts them) to the innermost substrat function on the
stack that names a purpose in :data:`PURPOSES` (an append, a record write, a log
opened, ...), then prints one markdown table. A call no purpose claims is shown by
its innermost substrat function, so a new call site shows up rather than hides.

Counts, not times, as ``bench_step_calls``: the same examples make the same calls
(docs/benchmarks.md, "Eighteenth pass: the lifecycle fuzzer's operations").
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from oracle.bench_step_calls import FAULTFS_CALLS

PURPOSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "a session record written (temp file, write, fsync, rename, directory fsync)",
        ("store.py:save", "store.py:_mark_terminated", "store.py:take_back_new"),
    ),
    ("an event log append (pending copy, write, fsync, the link check)", ("eventlog.py:log",)),
    (
        "an event log opened or closed (list, open, repair scan, pending file)",
        ("eventlog.py:_open", "eventlog.py:_poison", "eventlog.py:close", "eventlog.py:_unlink"),
    ),
    ("a conversation read from its log (a session restored)", ("conversation.py:",)),
    ("a checkpoint built or appended; the store opened", ("checkpoints.py:", "checkpointer.py:")),
    (
        "the start summary (written at a clean close, read and retired at each open)",
        ("start_summary.py:",),
    ),
    (
        "recovery's reads (records, logs, registry, markers)",
        ("recovery", "registry.py:load", "registry.py:_mode", "registry.py:quarantined")
        + ("store.py:scan", "store.py:recover", "store.py:_read_limited", "store.py:list_dirs")
        + ("store.py:marked_terminated", "rootmarker.py:"),
    ),
    (
        "directories made durable; the root checked and held at each open",
        ("persistence.py:durable_mkdir", "store.py:make_dir", "store.py:make_root_durable")
        + ("root_hold.py:", "rootdir.py:", "opening.py:"),
    ),
)
"""(purpose, the ``file:function`` fragments that name it), tried in this order on
each substrat frame from the innermost out: the first frame that names one decides."""
SITE_DEPTH = 16
"""Frames looked at above a call: deep enough for every purpose above."""


def site_of(frames: list[str]) -> str:
    """The purpose of a call whose substrat frames (``file:function``, innermost first)
    are ``frames``; its innermost frame (or "?") when no purpose names one."""
    for frame in frames:
        for purpose, fragments in PURPOSES:
            if any(fragment in frame for fragment in fragments):
                return purpose
    return f"other: {frames[0] if frames else '?'}"


def _substrat_frames(depth: int = SITE_DEPTH) -> list[str]:
    frames: list[str] = []
    frame: FrameType | None = sys._getframe(2)  # the wrapped faultfs method's caller
    while frame is not None and len(frames) < depth:
        filename = frame.f_code.co_filename
        at = filename.rfind("/substrat/")
        if at >= 0:
            frames.append(f"{filename[at + len('/substrat/') :]}:{frame.f_code.co_name}")
        frame = frame.f_back
    return frames


@contextmanager
def charging() -> Iterator[Counter[str]]:
    """Charge every faultfs call made in the block to its purpose (the counter)."""
    from faultfs import _syscalls

    sites: Counter[str] = Counter()
    owner = _syscalls.Syscalls
    saved = {name: owner.__dict__[name] for name in FAULTFS_CALLS if name in owner.__dict__}

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def charged(self: Any, *args: Any, **kwargs: Any) -> Any:
            sites[site_of(_substrat_frames())] += 1
            return method(self, *args, **kwargs)

        return charged

    for name, method in saved.items():
        setattr(owner, name, wrap(method))
    try:
        yield sites
    finally:
        for name, method in saved.items():
            setattr(owner, name, method)


def charge_lifecycle(examples: int = 100, steps: int = 30) -> Counter[str]:
    """The faultfs calls of the lifecycle fuzzer's seeded examples, per purpose."""
    from oracle.bench_fuzz import run_seeded
    from oracle.bench_profile import WARM_UP_EXAMPLES
    from oracle.lifecycle import LifecycleMachine

    run_seeded(LifecycleMachine, WARM_UP_EXAMPLES, steps, 0)
    with charging() as sites:
        run_seeded(LifecycleMachine, examples, steps)
    return sites


def render(sites: Counter[str], examples: int) -> str:
    total = sum(sites.values())
    lines = [
        f"{total:,} faultfs calls, {total / max(examples, 1):,.0f} an example",
        "",
        f"| what made the call | faultfs calls ({examples} examples) | share |",
        "|---|---:|---:|",
    ]
    for site, count in sites.most_common():
        lines.append(f"| {site} | {count:,} | {100 * count / max(total, 1):.1f}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="what the lifecycle fuzzer's faultfs calls do")
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    print(render(charge_lifecycle(args.examples, args.steps), args.examples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
