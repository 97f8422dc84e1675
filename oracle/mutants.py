"""Run durability mutants: does the test suite kill every one of them?

``python -m oracle.mutants`` plants each mutant of the planted-bug catalog
(:data:`oracle.mutant_catalog.CATALOG`), or with ``--systematic`` each mutant
generated from the code (:mod:`oracle.mutant_gen`: every durable call, event-log
write and repair step deleted on its own), in a temporary copy of the
``substrat`` package (never in the working tree), runs the tests against that
copy and reports which check killed it::

    python -m oracle.mutants                      # the catalog, ci profile, one at a time
    python -m oracle.mutants --systematic --jobs 2
    python -m oracle.mutants --jobs 2 --only no_torn_tail_repair --only stale_blob_trusted
    python -m oracle.mutants --tests tests/stress/test_persistence_fuzz.py --json
    python -m oracle.mutants --systematic --list

The tests run in the order given, cheapest and most targeted first, and a
mutant's run stops at its first real kill: a failed durability or recovery
check. Failures of harness checks (a crash point that moved, a changed boundary
count) are reported as ``harness``, not as kills (see ``oracle._mutant_guard``
and ``oracle.mutant_report``). A systematic survivor fails the run unless the
reviewed allow-list in docs/mutants.md gives the reason nothing is lost.

How a run is isolated: the copy sits in a fresh temporary directory that is put
first on ``PYTHONPATH``; ``PYTHONSAFEPATH=1`` keeps ``python -m`` from putting
the working directory ahead of it (daemon subprocesses inherit both), and the
``oracle._mutant_guard`` plugin refuses to run if ``substrat`` was imported
from anywhere else. pytest runs in the temporary directory, so a Hypothesis
example database there collects the mutant's failures instead of the project's
corpus, and ``HYPOTHESIS_REDIS_URL`` is dropped so they never reach a shared one.

Before the mutants, the same suite runs on an unmodified copy (the baseline):
if it fails, no mutant result would mean anything, so the run stops there.

Exit status: 0 when every mutant was killed or allowed, 1 when one survived,
was seen only by the harness or timed out, or the allow-list is stale, 2 on
errors (a snippet or call that no longer exists, a failing baseline, a broken run).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import substrat
from oracle import _mutant_guard, mutant_gen
from oracle import mutant_report as report
from oracle.errors import MutantError
from oracle.mutant_catalog import Mutant, by_name
from oracle.mutant_gen import Site
from oracle.mutant_report import (
    ERROR,
    HARNESS,
    KILLED,
    RAISED,
    SURVIVED,
    TIMEOUT,
    MutantResult,
)

# Cheapest and most targeted first: a mutant's run stops at its first real kill.
DEFAULT_TESTS = (
    "tests/stress/test_persistence_fuzz.py",
    "tests/integration/test_start_summary.py",  # the start summary's checks (a few seconds)
    "tests/integration/test_start_quiet.py",  # its quiet agents demoted (a few seconds)
    "tests/stress",
)
SYSTEMATIC_TESTS = (
    "tests/stress/test_persistence_fuzz.py",
    "tests/unit/test_persistence_crash.py",
    "tests/unit/test_eventlog.py",
    "tests/unit/test_session_store.py",
    "tests/unit/test_root_durability.py",
    "tests/integration/test_recovery_blind_spots.py",
    "tests/integration/test_recovery_points.py",
    "tests/integration/test_recovery_idempotence.py",
    "tests/integration/test_oracle_regressions.py",
    "tests/integration/test_recovery_history.py",
    "tests/integration/test_fsck_corpus.py",
    "tests/integration/test_root_registry.py",
    "tests/integration/test_turn_ids.py",
    "tests/integration/test_unreadable_agent.py",
    "tests/integration/test_segment_roll_durability.py",
    "tests/stress/test_crash_fuzz.py",
    "tests/stress/test_sweep.py",
    "tests/stress/test_lifecycle_fuzz.py",
    "tests/stress/test_daemon_sigkill.py",
)
ALLOW_LIST = Path("docs/mutants.md")
DEFAULT_PROFILE = "ci"
DEFAULT_TIMEOUT_S = 1800.0
PACKAGE = "substrat"
_KILL_GRACE_S = 5.0
_OUTPUT_TAIL_CHARS = 2000

Planted = Mutant | Site
"""A catalog mutant (a snippet replaced) or a systematic one (a call deleted)."""


@dataclass(frozen=True)
class RunConfig:
    tests: tuple[str, ...] = DEFAULT_TESTS
    profile: str = DEFAULT_PROFILE
    timeout_s: float = DEFAULT_TIMEOUT_S
    pytest_args: tuple[str, ...] = ()
    repo: Path = Path(".")
    source: Path = Path(substrat.__file__).parent


def default_repo() -> Path:
    """The checkout whose tests run: the one holding this oracle, else the cwd."""
    here = Path(__file__).resolve().parents[1]
    return here if (here / "tests").is_dir() else Path.cwd()


# -- planting ------------------------------------------------------------------------


def plant(mutant: Planted | None, source: Path, dest: Path) -> Path:
    """Copy the package at ``source`` into ``dest`` and plant ``mutant`` in the copy.

    Returns the copied package directory. Raises :class:`MutantError` unless the
    mutant's snippet occurs exactly once (a catalog mutant) or its call still
    exists (a systematic one). ``None`` plants nothing (the baseline).
    """
    source, dest = source.resolve(), dest.resolve()
    if dest == source or dest.is_relative_to(source) or source.is_relative_to(dest):
        raise MutantError(f"refusing to plant into {dest}: it overlaps the source {source}")
    package = dest / PACKAGE
    shutil.copytree(source, package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if mutant is None:
        return package
    if isinstance(mutant, Site):
        try:
            mutant_gen.delete(package, mutant.name)
        except LookupError as exc:
            raise MutantError(str(exc)) from exc
        return package
    target = package / mutant.file
    if not target.is_file():
        raise MutantError(f"mutant {mutant.name}: {PACKAGE}/{mutant.file} does not exist")
    text = target.read_text(encoding="utf-8")
    count = text.count(mutant.old)
    if count != 1:
        raise MutantError(
            f"mutant {mutant.name}: its snippet occurs {count} times in {PACKAGE}/{mutant.file} "
            "(exactly 1 is required); the code changed, so update the snippet in "
            "oracle/mutant_catalog.py"
        )
    target.write_text(text.replace(mutant.old, mutant.new), encoding="utf-8")
    return package


def check_catalog(mutants: Sequence[Mutant], source: Path) -> dict[str, str]:
    """Problems per mutant name (empty when every snippet plants cleanly and compiles)."""
    problems: dict[str, str] = {}
    for mutant in mutants:
        with tempfile.TemporaryDirectory(prefix="substrat-mutant-check-") as tmp:
            try:
                package = plant(mutant, source, Path(tmp))
                path = package / mutant.file
                compile(path.read_text(encoding="utf-8"), str(path), "exec")
            except (MutantError, SyntaxError) as exc:
                problems[mutant.name] = str(exc)
    return problems


# -- running -------------------------------------------------------------------------


def _test_args(config: RunConfig) -> list[str]:
    out = []
    for spec in config.tests:
        path, sep, rest = spec.partition("::")
        absolute = (config.repo / path).resolve()
        out.append(str(absolute) + sep + rest)
    return out


def _command(config: RunConfig) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        *_test_args(config),
        "--rootdir",
        str(config.repo.resolve()),
        "--run-stress",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "oracle._mutant_guard",
        *config.pytest_args,
    ]


def _environment(tmp: Path, report: Path, profile: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp), env.get("PYTHONPATH", "")) if p)
    env["PYTHONSAFEPATH"] = "1"
    env["HYPOTHESIS_PROFILE"] = profile
    env.pop("HYPOTHESIS_REDIS_URL", None)
    env[_mutant_guard.DIR_ENV] = str(tmp)
    env[_mutant_guard.REPORT_ENV] = str(report)
    return env


def _records(report: Path) -> list[dict[str, str]]:
    try:
        lines = report.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


_RUNNING: set[subprocess.Popen[bytes]] = set()
"""pytest runs in progress, so an interrupted runner stops them (they are in their own
process groups, which a Ctrl-C or a SIGTERM to the runner does not reach)."""


def _run_pytest(config: RunConfig, tmp: Path, report: Path) -> tuple[int | None, str]:
    """Exit code (None on timeout) and the tail of the output."""
    proc = subprocess.Popen(
        _command(config),
        cwd=tmp,
        env=_environment(tmp, report, config.profile),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # so a timeout can stop the whole process group
    )
    _RUNNING.add(proc)
    try:
        out, _ = proc.communicate(timeout=config.timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        out, _ = proc.communicate()
        code = None
    finally:
        _RUNNING.discard(proc)
    return code, out.decode("utf-8", "replace")[-_OUTPUT_TAIL_CHARS:]


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _stop_all(signum: int, _frame: object) -> None:
    for proc in list(_RUNNING):
        _stop_group(proc)
    raise SystemExit(128 + signum)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, _KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_mutant(mutant: Planted | None, config: RunConfig) -> MutantResult:
    """Plant ``mutant`` (``None``: the baseline) in a temporary copy and run the tests."""
    name = "(baseline)" if mutant is None else mutant.name
    result = MutantResult(
        name,
        "the unmodified code" if mutant is None else mutant.description,
        "" if mutant is None else mutant.file,
        ERROR,
    )
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="substrat-mutant-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            plant(mutant, config.source, tmp)
        except MutantError as exc:
            result.message = str(exc)
            return result
        report = tmp / "failures.jsonl"
        code, output = _run_pytest(config, tmp, report)
        records = _records(report)
    result.duration_s = time.monotonic() - start
    _classify(result, code, output, records, config)
    return result


def _classify(
    result: MutantResult,
    code: int | None,
    output: str,
    records: list[dict[str, str]],
    config: RunConfig,
) -> None:
    configured = any(r["kind"] == "configured" for r in records)
    failed = [r for r in records if r["kind"] == "failed"]
    real = [r for r in failed if r.get("check") == _mutant_guard.REAL]
    crashed = [r for r in failed if r.get("check") == _mutant_guard.RAISED]
    broken = [r for r in records if r["kind"] == "collect_error"]
    if code is None:
        result.status = TIMEOUT
        result.message = f"no verdict within {config.timeout_s:.0f} s (raise --timeout)"
    elif not configured:
        result.message = "the guard plugin never ran; pytest said:\n" + output
    elif broken:
        result.message = f"collection failed at {broken[0]['nodeid']}: {broken[0]['message']}"
    elif code == 0:
        result.status = SURVIVED
    elif code in (1, 2) and real:  # 2: the guard stopped the session at the kill
        result.status = KILLED
        result.killer = real[0]["nodeid"]
        result.message = real[0]["message"]
    elif code in (1, 2) and crashed:
        result.status = RAISED
        result.killer = crashed[0]["nodeid"]
        result.message = f"{crashed[0].get('exception', '')}: {crashed[0]['message']}"
    elif code == 1 and failed:
        result.status = HARNESS
        result.killer = failed[0]["nodeid"]
        result.message = f"{failed[0].get('exception', '')}: {failed[0]['message']}"
    else:
        result.message = f"pytest exited with {code} and no failing test; output:\n{output}"


def run_catalog(
    mutants: Sequence[Planted],
    config: RunConfig,
    *,
    jobs: int = 1,
    on_result: Callable[[MutantResult], None] | None = None,
) -> list[MutantResult]:
    """Run every mutant (``jobs`` at a time); results in catalog order."""
    results: dict[str, MutantResult] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        futures = {pool.submit(run_mutant, m, config): m for m in mutants}
        for future in as_completed(futures):
            result = future.result()
            results[result.name] = result
            if on_result is not None:
                on_result(result)
    except BaseException:
        # Interrupted: start nothing more (the signal handler stopped the runs in progress).
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return [results[m.name] for m in mutants]


# -- reporting -----------------------------------------------------------------------

exit_status = report.exit_status


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m oracle.mutants",
        description="Plant each durability mutant in a temporary copy of substrat and check "
        "that a durability or recovery check kills it.",
    )
    parser.add_argument(
        "--systematic",
        action="store_true",
        help="the mutants generated from the code (every durable call, event-log write and "
        "repair step deleted on its own) instead of the planted-bug catalog",
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this mutant (repeatable)",
    )
    parser.add_argument(
        "--tests",
        nargs="+",
        default=None,
        metavar="PATH",
        help="test paths or node ids relative to the repository, run in this order "
        "(default: the persistence fuzzer, then tests/stress; --systematic adds the unit "
        "and integration crash tests before the stress suite)",
    )
    parser.add_argument(
        "--profile", default=DEFAULT_PROFILE, help="HYPOTHESIS_PROFILE for the runs (default: ci)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="mutants run in parallel")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="per-mutant limit; a run over it is reported as a timeout",
    )
    parser.add_argument(
        "--pytest-args",
        default="",
        metavar="ARGS",
        help="extra pytest arguments, one shell-quoted string",
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the run on the unmodified code"
    )
    parser.add_argument(
        "--allow-list",
        type=Path,
        default=None,
        metavar="FILE",
        help="the reviewed allow-list of survivors (default: docs/mutants.md)",
    )
    parser.add_argument(
        "--markdown", type=Path, default=None, metavar="FILE", help="also write the table here"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser.parse_args(argv)


def _mutants(systematic: bool, source: Path) -> dict[str, Planted]:
    if systematic:
        return {site.name: site for site in mutant_gen.sites(source)}
    return dict(by_name())


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.jobs < 1 or args.timeout <= 0:
        print("--jobs must be >= 1 and --timeout > 0", file=sys.stderr)
        return 2
    repo = default_repo()
    config = RunConfig(
        tests=tuple(args.tests or (SYSTEMATIC_TESTS if args.systematic else DEFAULT_TESTS)),
        profile=args.profile,
        timeout_s=args.timeout,
        pytest_args=tuple(shlex.split(args.pytest_args)),
        repo=repo,
    )
    # An installed substrat has no tests (they are not in the wheel): pytest would stop at
    # the first option only substrat's conftest knows, which says nothing of the cause.
    missing = [t for t in config.tests if not (repo / t.split("::")[0]).exists()]
    if missing and not args.list:
        print(
            f"python -m oracle.mutants runs substrat's own tests, and {repo} does not hold"
            f" {', '.join(missing)}: run it from a checkout of substrat's source (the"
            " installed package has no tests), or name test paths there with --tests",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="substrat-mutant-source-") as snapshot:
        # One copy of the package, taken now: the baseline and every mutant test
        # the same code even if the working tree changes while the run goes on.
        config = replace(config, source=plant(None, config.source, Path(snapshot)))
        everything = _mutants(args.systematic, config.source)
        if args.list:
            _list(everything, args.json)
            return 0
        unknown = [n for n in args.only if n not in everything]
        if unknown:
            print(f"unknown mutants {unknown}; see --list", file=sys.stderr)
            return 2
        chosen = [everything[n] for n in args.only] if args.only else list(everything.values())
        allow_path = args.allow_list or repo / ALLOW_LIST
        allowed = report.load_allow_list(allow_path) if allow_path.is_file() else {}
        # Names of the other kind of mutant are not this run's business.
        allowed = {n: r for n, r in allowed.items() if (":" in n) == args.systematic}
        stale = [] if args.only else report.missing_entries(list(everything), allowed)
        previous = {signum: signal.signal(signum, _stop_all) for signum in _STOP_SIGNALS}
        try:
            return _run_and_report(args, chosen, config, allowed, stale)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _list(everything: dict[str, Planted], as_json: bool) -> None:
    if as_json:
        print(json.dumps([asdict(m) for m in everything.values()], indent=2))
        return
    for name, m in everything.items():
        print(f"{name:60} {m.description}")


def _progress(result: MutantResult) -> None:
    where = f" by {result.killer}" if result.killer else ""
    print(
        f"  {result.name}: {result.status}{where} ({result.duration_s:.1f}s)",
        file=sys.stderr,
        flush=True,
    )


def _run_and_report(
    args: argparse.Namespace,
    mutants: list[Planted],
    config: RunConfig,
    allowed: dict[str, str],
    stale: list[str],
) -> int:
    start = time.monotonic()
    baseline = None
    if not args.no_baseline:
        print("baseline: the suite on the unmodified code", file=sys.stderr, flush=True)
        baseline = run_mutant(None, config)
        _progress(baseline)
        if baseline.status != SURVIVED:
            print(
                f"the baseline run did not pass ({baseline.status}); mutant results would "
                f"mean nothing:\n{baseline.message}",
                file=sys.stderr,
            )
            return 2
    print(
        f"running {len(mutants)} mutants, {args.jobs} at a time, profile {args.profile}",
        file=sys.stderr,
        flush=True,
    )
    results = run_catalog(mutants, config, jobs=args.jobs, on_result=_progress)
    stale = stale + report.apply_allow_list(results, allowed)
    total_s = time.monotonic() - start
    title = "systematic mutants" if args.systematic else "planted durability bugs"
    if args.markdown is not None:
        args.markdown.write_text(report.markdown(results, total_s, title), encoding="utf-8")
    if args.json:
        document = {
            "kind": "systematic" if args.systematic else "catalog",
            "profile": args.profile,
            "tests": list(config.tests),
            "baseline_s": None if baseline is None else round(baseline.duration_s, 1),
            "total_s": round(total_s, 1),
            "counts": report.counts(results),
            "stale_allow_list": stale,
            "results": [r.to_dict() for r in results],
        }
        print(json.dumps(document, indent=2))
    else:
        report.render_table(results, total_s, title)
        for line in stale:
            print(f"allow-list: {line}; update docs/mutants.md")
    return exit_status(results, stale)


if __name__ == "__main__":
    raise SystemExit(main())
