#!/usr/bin/env bash
# Power-loss campaign: the real daemon on a LazyFS mount, SIGKILLed and its unsynced
# data dropped at random points, then checked against the oracle (docs/lazyfs.md).
#
# Needs LazyFS (LAZYFS_BIN, or `lazyfs` on PATH), /dev/fuse, and root or fusermount3.
# Without LazyFS the script fails (exit 2) saying how to get it; with
# POWERLOSS_REQUIRE_LAZYFS=0 it prints the same reason and exits 0 (skipped).
#
#   POWERLOSS_CYCLES          power-loss cycles (default: 100)
#   POWERLOSS_SEED            seed of the workload and the cut points (default: today, YYYYMMDD)
#   POWERLOSS_MAX_RUN_S       longest stretch of load before a cut, in seconds (default: 1.0)
#   POWERLOSS_OUT             report.md, report.json, daemon.log, LazyFS's log, and on
#                             failure the disk's state (default: powerloss-out)
#   POWERLOSS_REQUIRE_LAZYFS  1 (default): fail without LazyFS; 0: skip
#   extra arguments are passed to `python -m oracle.powerloss` (e.g. --inject-probability 0.5)
set -euo pipefail
cd "$(dirname "$0")/.."

cycles="${POWERLOSS_CYCLES:-100}"
seed="${POWERLOSS_SEED:-$(date -u +%Y%m%d)}"
max_run_s="${POWERLOSS_MAX_RUN_S:-1.0}"
out="${POWERLOSS_OUT:-powerloss-out}"
require="${POWERLOSS_REQUIRE_LAZYFS:-1}"

if ! [[ "$cycles" =~ ^[0-9]+$ ]] || [ "$cycles" -lt 1 ]; then
    echo "powerloss: POWERLOSS_CYCLES must be a positive number, got '$cycles'" >&2
    exit 2
fi
if ! [[ "$seed" =~ ^[0-9]+$ ]]; then
    echo "powerloss: POWERLOSS_SEED must be a non-negative integer, got '$seed'" >&2
    exit 2
fi
if [ "$require" != 0 ] && [ "$require" != 1 ]; then
    echo "powerloss: POWERLOSS_REQUIRE_LAZYFS must be 0 or 1, got '$require'" >&2
    exit 2
fi

if ! command -v python >/dev/null; then
    echo "powerloss: no 'python' on PATH: activate the virtualenv the project is installed in" \
        "(python -m venv .venv && . .venv/bin/activate && pip install -e .)" >&2
    exit 2
fi

args=(--cycles "$cycles" --seed "$seed" --max-run-s "$max_run_s" --out "$out")
if [ "$require" = 0 ]; then
    args+=(--skip-without-lazyfs)
fi
echo "powerloss: cycles=$cycles seed=$seed max-run=${max_run_s}s out=$out" \
    "lazyfs=${LAZYFS_BIN:-(lazyfs on PATH)}"
exec python -m oracle.powerloss "${args[@]}" "$@"
