#!/usr/bin/env bash
# The planted-bug catalog: each durability mutant is planted in a temporary copy of
# substrat and the stress suite must kill it. Exits non-zero if one survives.
#
#   HYPOTHESIS_PROFILE   profile for the runs (default: ci, derandomized)
#   MUTANT_JOBS          mutants run in parallel (default: 2)
#   MUTANT_TIMEOUT_S     per-mutant limit in seconds (default: 1800)
#   extra arguments are passed on (e.g. --only no_pending_replay --json)
set -euo pipefail
cd "$(dirname "$0")/.."

profile="${HYPOTHESIS_PROFILE:-ci}"
jobs="${MUTANT_JOBS:-2}"
timeout_s="${MUTANT_TIMEOUT_S:-1800}"

echo "mutants: profile=${profile} jobs=${jobs} per-mutant timeout=${timeout_s}s" >&2
exec python -m oracle.mutants --profile "$profile" --jobs "$jobs" --timeout "$timeout_s" "$@"
