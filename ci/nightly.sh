#!/usr/bin/env bash
# Nightly fuzzing campaign: random seeds, the `nightly` profile, one shard of the stress suite.
#
# The corpus lives in .hypothesis/ (restored from the CI cache by the workflow, so
# each night starts with everything earlier nights found) and, when
# HYPOTHESIS_REDIS_URL is set, is shared with every other shard through Redis.
#
#   SHARD_INDEX             this shard, 0-based (default: 0)
#   SHARD_COUNT             number of shards (default: 1 = everything)
#   NIGHTLY_WORKERS         pytest-xdist workers (default: auto)
#   NIGHTLY_TEST_TIMEOUT_S  per-test cap enforced by pytest-timeout (default: 3000)
#   NIGHTLY_BUDGET_S        fuzzing time of this shard (default: 6000; 0 = no budget): the
#                           fuzzers draw no new example after it, nor past 80% of their cap
#                           (pytest --fuzz-budget, oracle/fuzz_budget.py), and pass saying
#                           after how many examples they stopped
#   NIGHTLY_LOG_DIR         where the log and failure report go (default: nightly-logs)
#   extra arguments are passed to pytest
#
# Sharding: the stress tests are collected once, in pytest's stable order, and
# shard i takes every SHARD_COUNT-th test starting at i. On failure a markdown
# report with the failing tests, the reproduction command and Hypothesis's
# falsifying examples is written next to the log (the workflow files it as an issue).
set -euo pipefail
cd "$(dirname "$0")/.."

export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-nightly}"
shard_index="${SHARD_INDEX:-0}"
shard_count="${SHARD_COUNT:-1}"
workers="${NIGHTLY_WORKERS:-auto}"
timeout_s="${NIGHTLY_TEST_TIMEOUT_S:-3000}"
budget_s="${NIGHTLY_BUDGET_S:-6000}"
log_dir="${NIGHTLY_LOG_DIR:-nightly-logs}"

is_count() { [[ "$1" =~ ^[0-9]+$ ]]; }
if ! is_count "$shard_index" || ! is_count "$shard_count" || [ "$shard_count" -lt 1 ] \
    || [ "$shard_index" -ge "$shard_count" ]; then
    echo "nightly: need 0 <= SHARD_INDEX < SHARD_COUNT, got SHARD_INDEX=$shard_index" \
        "SHARD_COUNT=$shard_count" >&2
    exit 2
fi
if ! is_count "$timeout_s" || [ "$timeout_s" -lt 1 ]; then
    echo "nightly: NIGHTLY_TEST_TIMEOUT_S must be a positive number of seconds" >&2
    exit 2
fi
if ! is_count "$budget_s"; then
    echo "nightly: NIGHTLY_BUDGET_S must be a number of seconds (0: no budget)" >&2
    exit 2
fi
budget_args=()
if [ "$budget_s" -gt 0 ]; then budget_args=(--fuzz-budget "$budget_s"); fi

mkdir -p "$log_dir"
log="$log_dir/shard-$shard_index.log"
report="$log_dir/report-shard-$shard_index.md"
rm -f "$report"

collected="$log_dir/collected-$shard_index.txt"
collect_status=0
python -m pytest tests/stress --run-stress --collect-only -q -p no:randomly >"$collected" \
    || collect_status=$?
if [ "$collect_status" -ne 0 ] && [ "$collect_status" -ne 5 ]; then
    cat "$collected" >&2
    echo "nightly: collecting tests/stress failed (pytest exit $collect_status)" >&2
    exit "$collect_status"
fi

mapfile -t mine < <(grep '::' "$collected" \
    | awk -v i="$shard_index" -v n="$shard_count" '(NR - 1) % n == i')
total=$(grep -c '::' "$collected" || true)
echo "nightly: profile=$HYPOTHESIS_PROFILE shard $shard_index/$shard_count runs ${#mine[@]}" \
    "of $total stress tests; workers=$workers per-test timeout=${timeout_s}s" \
    "fuzz budget=${budget_s}s"
if [ "${#mine[@]}" -eq 0 ]; then
    echo "nightly: nothing for this shard to run"
    exit 0
fi
printf '%s\n' "${mine[@]}" >"$log_dir/shard-$shard_index.tests"

# One shell word, in single quotes (a quote inside becomes '\'').
quoted() {
    local q="'\\''"
    printf "'%s'" "${1//\'/$q}"
}

# A cancelled or timed-out job gets SIGINT, SIGTERM 7.5 s later, then SIGKILL: too soon
# for pytest and its workers to end, so a report written after them was never written
# and the log stopped before its summary. pytest runs in the background (bash defers a
# trap while a foreground command runs), so the trap writes what is known at once.
# shellcheck disable=SC2329  # called by the traps below
cut_short() {
    trap - INT TERM
    {
        echo "## Nightly fuzzing cut short: shard $shard_index of $shard_count"
        echo
        echo "- SIG$1 after $((SECONDS - started)) s, before pytest finished (a cancel, or the"
        echo "  job's timeout-minutes): this report has only what was known then"
        echo "- profile: \`$HYPOTHESIS_PROFILE\`, commit: \`$(git rev-parse HEAD 2>/dev/null || echo unknown)\`"
        echo
        echo "### Failed so far"
        echo
        grep -E '(^|[] ])(FAILED|ERROR) ' "$log" | grep -v '^E ' | sed -e 's/^/- /' || echo "- none seen"
        echo
        echo "### Replay"
        echo
        echo "Failing examples are saved to .hypothesis/ as they are found (this shard's"
        echo "corpus-shard-$shard_index artifact); with it, this replays them first:"
        echo
        echo '```'
        printf 'HYPOTHESIS_PROFILE=%s python -m pytest --run-stress' "$HYPOTHESIS_PROFILE"
        for id in "${mine[@]}"; do printf ' %s' "$(quoted "$id")"; done
        echo
        echo '```'
    } >"$report"
    if [ -n "$pytest_pid" ]; then  # its xdist workers first: they outlive a killed controller
        pkill -TERM -P "$pytest_pid" 2>/dev/null || true
        kill -s TERM "$pytest_pid" 2>/dev/null || true
    fi
    if [ -n "$tail_pid" ]; then kill "$tail_pid" 2>/dev/null || true; fi
    echo "nightly: cut short by SIG$1; report written to $report" >&2
    if [ "$1" = INT ]; then exit 130; fi
    exit 143
}

status=0
started=$SECONDS
pytest_pid=""
tail_pid=""
trap 'cut_short INT' INT
trap 'cut_short TERM' TERM
: >"$log"  # before tail: the background job opens it later, and tail gives up on no file
python -m pytest --run-stress -n "$workers" --timeout "$timeout_s" "${budget_args[@]}" -v -rfEs \
    "$@" "${mine[@]}" >"$log" 2>&1 &
pytest_pid=$!
tail -n +1 -f --pid="$pytest_pid" "$log" &  # the log on stdout as it grows; ends with pytest
tail_pid=$!
wait "$pytest_pid" || status=$?
wait "$tail_pid" || true
trap - INT TERM

# The fuzzers the budget stopped, and after how many examples: in the job's summary too.
budget_summary="$log_dir/budget-shard-$shard_index.txt"
sed -E 's/\x1b\[[0-9;]*m//g' "$log" | sed -n '/=\{3,\} fuzz budget =\{3,\}/,/^=\{3,\}/p' \
    | sed '1d;$d' >"$budget_summary" || true
if [ -s "$budget_summary" ] && [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    {
        echo "### Fuzz budget: shard $shard_index of $shard_count"
        echo
        sed -e 's/^/    /' "$budget_summary"
    } >>"$GITHUB_STEP_SUMMARY"
fi

# The shard's ids that failed or errored, whole. Ids hold spaces and quotes
# (test_sweep[checkpoints and deletion-12of12], test_matrix[durable_mkdir['a/b/c', 'a/d', 'e']-posix]),
# so the summary lines are matched against the ids this shard ran, not cut at a space.
failed_ids() {
    local plain id
    plain="$(sed -E 's/\x1b\[[0-9;]*m//g' "$log")"  # FORCE_COLOR or PY_COLORS may be set
    for id in "${mine[@]}"; do
        if grep -qxF -e "FAILED $id" -e "ERROR $id" <<<"$plain" \
            || grep -qF -e "FAILED $id - " -e "ERROR $id - " <<<"$plain"; then
            printf '%s\n' "$id"
        fi
    done
}

if [ "$status" -ne 0 ]; then
    {
        echo "## Nightly fuzzing failure: shard $shard_index of $shard_count"
        echo
        echo "- profile: \`$HYPOTHESIS_PROFILE\`, pytest exit status $status"
        echo "- commit: \`$(git rev-parse HEAD 2>/dev/null || echo unknown)\`"
        echo "- date (UTC): $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo
        echo "### Failed tests"
        echo
        grep -E '^(FAILED|ERROR) ' "$log" | sed -e 's/^/- /' || echo "- (see the log)"
        echo
        echo "### Reproduce"
        echo
        echo "With this run's .hypothesis/ corpus (the nightly cache), Hypothesis replays the"
        echo "failing example first:"
        echo
        echo '```'
        while IFS= read -r id; do
            echo "HYPOTHESIS_PROFILE=$HYPOTHESIS_PROFILE python -m pytest --run-stress $(quoted "$id")"
        done < <(failed_ids)
        echo '```'
        echo
        echo "### Falsifying examples"
        echo
        echo '```'
        # Hypothesis attaches the example to the exception, so pytest prints it as "E   ..."
        # lines; keep each block from its header ("Falsifying example" in older Hypothesis,
        # "Failing test case" in newer ones) to the end of those lines.
        awk '
            /Falsifying (explicit )?example|Failing test case/ { inblock = 1 }
            /reproduce_failure/ { print; next }
            inblock && !/^E / && !/Falsifying|Failing test case/ { inblock = 0; print "" }
            inblock { print }
        ' "$log" | head -c 50000
        echo '```'
    } >"$report"
    echo "nightly: failure report written to $report"
fi
exit "$status"
