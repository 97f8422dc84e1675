"""Daemon start with and without checkpoints, code against code, in interleaved rounds.

``python -m oracle.bench_checkpoints --only start`` starts one daemon per figure,
so on a shared machine its ratio moves with the load of the moment. This
compares versions of the code the way docs/benchmarks.md reports a change:
each round starts the daemon of every code tree (a directory put first on
``PYTHONPATH``, e.g. a ``git worktree`` of the commit before) on one generated
root with its checkpoint store, on the same root without it (the store moved
aside, and whatever the clean stop wrote removed, before it comes back), and on
an empty root, in a shuffled order; then it prints, per code tree, the medians
with the range over the rounds:

* daemon CPU seconds until the first ``ping``, with and without the store, and
  of the empty root (the interpreter, imports, lock and socket);
* microseconds per live agent above the empty daemon, with the store;
* the ratio with / without per round, CPU and wall clock (the issue 16 target
  is <= 0.05x);
* the daemon's peak RSS with and without the store.

The daemons run with ``PYTHONSAFEPATH=1``: ``python -m`` otherwise puts the
working directory first on ``sys.path``, ahead of ``PYTHONPATH``, so run from a
checkout every daemon imported that checkout's ``substrat``, whatever code tree
it was given (see docs/benchmarks.md, issue 16's sixth session).

Example (the commit before a change against the working tree)::

    git worktree add --detach /tmp/before <commit>
    nice -n 10 python -m oracle.bench_start_rounds \\
        --code before=/tmp/before --code after=. --rounds 3
"""

from __future__ import annotations

import os
import platform
import random
import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from oracle.bench_checkpoints import checkpoint_root
from oracle.bench_scale import ScaleRoot, StartResult, daemon_cold_start, generate_root
from substrat.checkpoints import CHECKPOINTS_DIR
from substrat.start_summary import summary_path

KINDS = ("with", "without", "empty")
MIB = 1 << 20


def start(
    root: ScaleRoot,
    empty: ScaleRoot,
    code: str,
    kind: str,
    summaries: dict[str, bytes] | None = None,
) -> StartResult:
    """One daemon start of the code at ``code`` (see the module docstring); ``summaries``:
    the start summary each code tree's clean stop last wrote (see :func:`_own_summary`)."""
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.path.abspath(code)
    # ``python -m`` puts the working directory first on sys.path, ahead of PYTHONPATH: run
    # from a checkout, every daemon would import that checkout's substrat, whatever ``code``
    safe = os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        if kind == "empty":
            return daemon_cold_start(empty)
        if kind == "with":
            return _own_summary(root, code, summaries)
        aside = root.path.parent / f"{root.path.name}.checkpoints-aside"
        os.rename(root.path / CHECKPOINTS_DIR, aside)
        try:
            return daemon_cold_start(root)
        finally:
            shutil.rmtree(root.path / CHECKPOINTS_DIR, ignore_errors=True)  # its clean stop's
            os.rename(aside, root.path / CHECKPOINTS_DIR)
    finally:
        if previous is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = previous
        if safe is None:
            del os.environ["PYTHONSAFEPATH"]
        else:
            os.environ["PYTHONSAFEPATH"] = safe


def _own_summary(root: ScaleRoot, code: str, summaries: dict[str, bytes] | None) -> StartResult:
    """A start with the start summary the code tree's own clean stop wrote last: trees of
    different summary formats would otherwise start from each other's (an older format's
    read without what a newer one adds, a newer one's not used at all). The store is not
    written by a start of an idle root, so each tree's summary stays valid for it."""
    path = Path(summary_path(root.path))
    if summaries is not None and code in summaries:
        path.write_bytes(summaries[code])
    result = daemon_cold_start(root)
    if summaries is not None and path.exists():
        summaries[code] = path.read_bytes()
    return result


def run_rounds(
    root: ScaleRoot,
    codes: dict[str, str],
    rounds: int,
    *,
    seed: int | None = None,
    say: Callable[[str], None] = print,
) -> dict[tuple[str, str], list[StartResult]]:
    """``rounds`` rounds of every (code, kind) start in a shuffled order."""
    shuffle = random.Random(seed)
    results: dict[tuple[str, str], list[StartResult]] = {}
    summaries: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="substrat-start-rounds-") as tmp:
        empty = ScaleRoot(Path(tmp) / "empty", 0, 0, 0)
        empty.path.mkdir(mode=0o700)  # an empty directory is adopted only if private
        if len(codes) > 1:  # each tree's own summary written once, not measured
            for name in codes:
                start(root, empty, codes[name], "with", summaries)
        for number in range(rounds):
            jobs = [(name, kind) for name in codes for kind in KINDS]
            shuffle.shuffle(jobs)
            for name, kind in jobs:
                result = start(root, empty, codes[name], kind, summaries)
                if kind != "empty" and result.agents != root.agents:
                    raise RuntimeError(f"{name} served {result.agents} agents, not {root.agents}")
                results.setdefault((name, kind), []).append(result)
                say(
                    f"round {number + 1} {name} {kind}: {result.cpu_seconds:.2f} CPU s, "
                    f"{result.seconds:.2f} s, {result.peak_rss_bytes / MIB:.1f} MiB, "
                    f"load {os.getloadavg()[0]:.1f}"
                )
    return results


def _spread(values: list[float], digits: int) -> str:
    return (
        f"{statistics.median(values):.{digits}f} "
        f"({min(values):.{digits}f}-{max(values):.{digits}f})"
    )


def summary(
    root: ScaleRoot, codes: dict[str, str], results: dict[tuple[str, str], list[StartResult]]
) -> list[str]:
    """Per code tree: medians (range) of what the module docstring lists."""
    events = f"{root.events:,} events" if root.events else "a reused root"
    lines = [f"Python {platform.python_version()}, {root.agents:,} agents, {events}"]
    for name in codes:
        with_, without, empty = (results[(name, kind)] for kind in KINDS)
        cpu = [r.cpu_seconds for r in with_]
        cpu_without = [r.cpu_seconds for r in without]
        cpu_empty = [r.cpu_seconds for r in empty]
        per_agent = [
            (a - e) / max(1, root.agents) * 1e6 for a, e in zip(cpu, cpu_empty, strict=True)
        ]
        lines += [
            f"{name}: daemon CPU s until ping, with checkpoints: {_spread(cpu, 2)}",
            f"{name}: daemon CPU s until ping, without: {_spread(cpu_without, 2)}",
            f"{name}: an empty root's daemon, CPU s: {_spread(cpu_empty, 2)}",
            f"{name}: with checkpoints, above the empty daemon, us per agent: "
            f"{_spread(per_agent, 0)}",
            f"{name}: ratio, CPU, per round: "
            f"{_spread([a / b for a, b in zip(cpu, cpu_without, strict=True)], 3)}",
            f"{name}: ratio, spawn to first ping (wall), per round: "
            + _spread([a.seconds / b.seconds for a, b in zip(with_, without, strict=True)], 3),
            f"{name}: daemon peak RSS, with checkpoints, MiB: "
            f"{_spread([r.peak_rss_bytes / MIB for r in with_], 1)}",
            f"{name}: daemon peak RSS, without, MiB: "
            f"{_spread([r.peak_rss_bytes / MIB for r in without], 1)}",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - a manual measurement
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--code", action="append", required=True, help="NAME=DIR: a code tree to start"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--events-per-agent", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--root", type=Path, default=None, help="a generated, checkpointed root to reuse"
    )
    args = parser.parse_args(argv)
    codes = dict(item.split("=", 1) for item in args.code)
    with tempfile.TemporaryDirectory(prefix="substrat-start-root-") as tmp:
        if args.root is not None:
            root = ScaleRoot(args.root, args.agents, 0, 0)  # its events are not counted
        else:
            root = generate_root(Path(tmp) / "root", args.agents, args.events_per_agent)
            checkpoint_root(root.path)
        results = run_rounds(root, codes, args.rounds, seed=args.seed)
    print("\n".join(summary(root, codes, results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
