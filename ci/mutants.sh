#!/usr/bin/env bash
# Durability mutants: the planted-bug catalog, then the systematic mutants generated from
# the code (every durable call, event-log write and repair step deleted on its own). Each
# is planted in a temporary copy of substrat; a durability or recovery check must kill it
# (the persistence fuzzer runs first: it is the cheapest killer), or, for a systematic
# mutant, the reviewed allow-list in docs/mutants.md must say why nothing is lost.
# Both kinds always run; the exit status is the worse of the two.
#
#   HYPOTHESIS_PROFILE   profile for the runs (default: ci, derandomized)
#   MUTANT_JOBS          mutants run in parallel (default: 2)
#   MUTANT_TIMEOUT_S     per-mutant limit in seconds (default: 1800)
#   MUTANT_OUT           where the Markdown result tables go (default: mutants-out)
#   MUTANT_KINDS         "catalog systematic" (default), or just one of them
#   extra arguments are passed on to each run (e.g. MUTANT_KINDS=catalog ... --only NAME)
set -euo pipefail
cd "$(dirname "$0")/.."

profile="${HYPOTHESIS_PROFILE:-ci}"
jobs="${MUTANT_JOBS:-2}"
timeout_s="${MUTANT_TIMEOUT_S:-1800}"
out="${MUTANT_OUT:-mutants-out}"
kinds="${MUTANT_KINDS:-catalog systematic}"
mkdir -p "$out"

status=0
for kind in $kinds; do
    case "$kind" in
        catalog) flags=() ;;
        systematic) flags=(--systematic) ;;
        *) echo "MUTANT_KINDS: unknown kind '$kind' (catalog, systematic)" >&2; exit 2 ;;
    esac
    echo "mutants ($kind): profile=${profile} jobs=${jobs} per-mutant timeout=${timeout_s}s" >&2
    started=$(date +%s)
    rc=0
    python -m oracle.mutants "${flags[@]}" --profile "$profile" --jobs "$jobs" \
        --timeout "$timeout_s" --markdown "$out/$kind.md" "$@" || rc=$?
    echo "mutants ($kind): exit $rc after $(($(date +%s) - started)) s; table in $out/$kind.md" >&2
    if [ "$rc" -gt "$status" ]; then status=$rc; fi
done
exit "$status"
