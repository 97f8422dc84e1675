#!/usr/bin/env bash
# The benchmark table of docs/benchmarks.md: fuzzing throughput, sweep rate,
# recovery at scale (10k, 100k and 1M events), EventLog.log against a raw
# write+fsync, faultfs against pyfakefs and the real file system.
#
# Every ratio is against a baseline measured in the same run (see oracle/bench.py).
# Takes a few minutes and up to ~1 GiB of disk under $TMPDIR; not part of any gate.
#
#   BENCH_PYTEST=1   also run the pytest-benchmark suite (tests/bench) first
#   extra arguments go to `python -m oracle.bench` (e.g. --no-baseline, --scale 10000 100000)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${BENCH_PYTEST:-0}" = "1" ]; then
    # pytest-benchmark switches itself off under xdist: run on one worker.
    python -m pytest tests/bench -p no:xdist --benchmark-only -q
fi
python -m oracle.bench "$@"
