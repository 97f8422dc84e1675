"""The benchmark table: fuzzing throughput, sweep rate, recovery at scale, durability cost.

Run ``python -m oracle.bench`` (or ``ci/bench.sh``). It prints one markdown
table; every figure sits next to a baseline measured in the same run, so the
ratio means something on a busy machine too:

* crash fuzzing, the lifecycle fuzzer and the sweep against the same code at
  ``--baseline-rev`` (a git revision, extracted to a temporary directory and run
  in a subprocess; :mod:`oracle.bench_fuzz`);
* recovery against a floor: reading the same logs with ``json.loads`` per line,
  and the 10k-event root's time per event for the growth rows (:mod:`oracle.bench_scale`);
* ``EventLog.log`` against a raw ``write`` + ``fsync`` of the same bytes, and against
  ``EventLog.log`` as of ``LOG_BEFORE_REV`` (before issue 15: two fsyncs per entry);
  faultfs against pyfakefs alone and against the real file system (:mod:`oracle.bench_io`);
* checkpoints (:mod:`oracle.bench_checkpoints`);
* with ``--origin PATH``, the origin's (Hardcode84/2) crash and lifecycle fuzzers in
  the same rounds as ours, in fresh processes pinned to one CPU (:mod:`oracle.bench_origin`);
  without it those two rows cite the figures issue 17 measured once;
* what the main job's costliest items pay per example or call (``--campaign-only``):
  the OpenAI crash machine's examples and one CLI process, against the same at
  ``--baseline-rev`` (:func:`oracle.bench_fuzz.campaign_rows`).

Rates of CPU-bound work are per CPU second of one process (``time.process_time``),
which is what "one core" means and what other load on the machine disturbs least.
"""

from __future__ import annotations

import argparse
import sys

from oracle.bench_fuzz import (
    BASELINE_REV,
    FUZZ_ROUNDS,
    campaign_rows,
    fuzz_rows,
    open_row,
    sweep_row,
)
from oracle.bench_io import faultfs_rows, log_rows
from oracle.bench_origin import add_arguments, from_arguments
from oracle.bench_table import GIB, MIB, Row, render

__all__ = ["GIB", "MIB", "Row", "main", "render"]  # Row, render and MIB: bench_checkpoints


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
        "--fuzz-only",
        action="store_true",
        help="only the fuzzing rows (crash fuzzer, lifecycle fuzzer) and their baselines",
    )
    parser.add_argument(
        "--campaign-only",
        action="store_true",
        help="only the rows of the main job's costliest calls (OpenAI crash machine, CLI)",
    )
    parser.add_argument(
        "--open-only",
        action="store_true",
        help="only the row of Orchestrator.open on small roots (what the fuzzers recover)",
    )
    parser.add_argument(
        "--rounds", type=int, default=FUZZ_ROUNDS, help="interleaved rounds of the fuzzing rows"
    )
    parser.add_argument(
        "--no-checkpoints", action="store_true", help="skip the rows of oracle.bench_checkpoints"
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    origin = from_arguments(args, parser)
    if args.log_only:
        print(render(log_rows()))
        return 0
    base = None if args.no_baseline else args.baseline_rev
    if args.open_only:
        print(render([open_row(base, args.rounds)]))
        return 0
    if args.campaign_only:
        print(render(campaign_rows(base, args.rounds)))
        return 0
    rows: list[Row] = fuzz_rows(base, args.rounds, origin)
    if args.fuzz_only:
        print(render(rows))
        return 0
    rows.extend(campaign_rows(base, args.rounds))
    from oracle.bench_scale import scale_rows

    rows.append(open_row(base, args.rounds))
    rows.append(sweep_row(base))
    rows.extend(scale_rows(args.scale, single_agent=not args.no_single_agent))
    rows.extend(log_rows())
    if not args.no_checkpoints:
        from oracle.bench_checkpoints import checkpoint_rows

        rows.extend(checkpoint_rows())
    rows.extend(faultfs_rows())
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
