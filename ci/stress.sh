#!/usr/bin/env bash
# The stress suite (crash-recovery fuzzers, sweeps, SIGKILL runs) as the PR gate runs it.
#
# The profile defaults to `ci`: derandomized, so the same inputs run on every push
# and a failure belongs to the change under test, not to luck.
#
#   STRESS_WORKERS          pytest-xdist workers (default: auto)
#   STRESS_TEST_TIMEOUT_S   per-test cap enforced by pytest-timeout (default: 1800)
#   extra arguments are passed to pytest (e.g. -k crash -x)
set -euo pipefail
cd "$(dirname "$0")/.."

export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
workers="${STRESS_WORKERS:-auto}"
timeout_s="${STRESS_TEST_TIMEOUT_S:-1800}"

echo "stress: profile=${HYPOTHESIS_PROFILE} workers=${workers} per-test timeout=${timeout_s}s"
status=0
python -m pytest tests/stress --run-stress -n "$workers" --timeout "$timeout_s" -rfEs "$@" || status=$?
if [ "$status" -eq 5 ]; then
    # pytest's "no tests collected": a gate that ran nothing must not pass as green.
    echo "stress: no stress tests were collected under tests/stress" >&2
fi
exit "$status"
