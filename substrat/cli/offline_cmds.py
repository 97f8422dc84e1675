"""``substrat fsck``, ``substrat recover`` and ``substrat demo``: no daemon needed."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from substrat.cli import render
from substrat.cli.common import EXIT_FAILED, Opts, emit_json, esc, guarded, offline_command
from substrat.errors import FsckError, RootLockedError

SEVERITY_STYLE = {"damage": "bold red", "leftover": "yellow", "notice": "dim"}


@click.command("fsck")
@offline_command
@click.option("--repair", is_flag=True, help="Repair what is found (the daemon must be stopped).")
def fsck(opts: Opts, repair: bool) -> None:
    """Check a stopped root offline: logs, records, pending and temp files, orphans.

    Without --repair nothing on disk changes. Exit codes: 0 clean (notices
    allowed), 1 damage or leftovers found (repaired, with --repair), 2 the
    check could not run.
    """
    from substrat import fsck as fsck_mod

    report = fsck_mod.check(opts.root, repair=repair)
    if opts.json:
        emit_json(report.to_dict())
        sys.exit(report.exit_code)
    out = opts.out
    out.print(
        f"fsck {esc(report.root)}: {report.sessions} sessions, {report.logs} logs, "
        f"{report.entries} entries"
    )
    if report.findings:
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in ("SEVERITY", "KIND", "PATH", "DETAIL", "REPAIRED" if repair else "REPAIR"):
            table.add_column(column)
        for f in report.findings:
            style = SEVERITY_STYLE.get(f.severity, "white")
            if repair and f.severity != "notice":
                fix = "[green]yes[/]" if f.repaired else "[red]no[/]"
            else:
                fix = esc(f.repair or "-")
            table.add_row(f"[{style}]{f.severity}[/]", esc(f.kind), esc(f.path), esc(f.detail), fix)
        out.print(table)
    problems = report.problems
    if not problems:
        out.print("[green]clean[/]")
    elif repair:
        left = [f for f in problems if not f.repaired]
        out.print(
            f"[bold]{len(problems)} problem(s) found, {len(problems) - len(left)} repaired[/]"
            + (f", [red]{len(left)} left[/]" if left else "")
        )
        if report.recovery:
            for line in render.recovery_lines({"report": report.recovery}):
                out.print(f"  {line}")
    else:
        out.print(
            f"[bold red]{len(problems)} problem(s) found[/]; nothing was changed "
            f"(repair with `substrat fsck --repair --root {esc(report.root)}`)"
        )
    sys.exit(report.exit_code)


@click.command("recover")
@offline_command
@click.option("--dry-run", is_flag=True, help="Only show what recovery would do.")
def recover(opts: Opts, dry_run: bool) -> None:
    """What recovery does to a root, per agent (the daemon runs it at every start).

    --dry-run reads only: last completed turn, the turn lost in flight, the
    messages to redeliver and the effects to reconcile. Without it, recovery
    runs now, offline (the daemon must be stopped).
    """
    from substrat import recovery

    if not opts.root.is_dir():
        raise FsckError(f"{opts.root} is not a directory (no substrat root there)")
    if dry_run:
        plan = recovery.analyze(opts.root).to_dict()
        if opts.json:
            emit_json(plan)
        else:
            _print_plan(opts, plan)
        return
    data = asyncio.run(_recover_now(opts.root))
    if opts.json:
        emit_json(data)
    else:
        for line in render.recovery_lines({"report": data}):
            opts.out.print(line)


async def _recover_now(root: Path) -> dict[str, Any]:
    from substrat.orchestrator import Orchestrator
    from substrat.rpc.lock import RootLock

    try:
        held = RootLock.acquire(root, retry_s=0)
    except RootLockedError as exc:
        raise FsckError(f"{exc} (the running daemon has already recovered this root)") from None
    try:
        orch = await Orchestrator.open(root)
        report = orch.recovery_report
        await orch.close()
        return report.to_dict() if report is not None else {}
    finally:
        held.release()


def _print_plan(opts: Opts, plan: dict[str, Any]) -> None:
    out = opts.out
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in (
        "AGENT",
        "SESSION",
        "STATUS",
        "LAST COMPLETED",
        "LOST IN FLIGHT",
        "REDELIVER",
        "RECONCILE",
        "DAMAGE",
    ):
        table.add_column(column)
    for a in plan["agents"]:
        last = a.get("last_completed_turn") or {}
        lost = a.get("lost_turn") or {}
        damage = ", ".join(f"{k}={v}" for k, v in sorted((a.get("damage") or {}).items()))
        table.add_row(
            esc(a.get("name") or "?"),
            render.short(a["session_id"]),
            esc(a["status"]),
            esc(f"{last.get('turn_id')}: {render.excerpt(last.get('prompt', ''), 24)}")
            if last
            else "-",
            f"[red]{esc(lost.get('turn_id'))}: {esc(render.excerpt(lost.get('prompt', ''), 24))}[/]"
            if lost
            else "-",
            str(len(a.get("to_redeliver") or [])),
            str(len(a.get("to_reconcile") or [])),
            esc(damage or "-"),
        )
    if plan["agents"]:
        out.print(table)
    else:
        out.print("no sessions under this root")
    if plan.get("user_pending"):
        out.print(f"user inbox: {len(plan['user_pending'])} message(s) to redeliver")
    for q in plan.get("quarantined", []):
        out.print(f"[yellow]to quarantine:[/] {esc(q['name'])} ({esc(q['reason'])})")


@click.command("demo")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.option("--keep", is_flag=True, help="Keep the temporary root (its path is printed).")
def demo(as_json: bool, keep: bool) -> None:
    """Watch a daemon get SIGKILLed mid-run and come back, on a temporary root.

    Exits 1 if an acknowledged turn did not survive (it never should).
    """
    guarded(Opts(root=Path(tempfile.gettempdir()), json=as_json), _demo, keep=keep)


def _demo(opts: Opts, keep: bool) -> None:
    from substrat.demo import run_demo

    def say(line: str) -> None:
        if not opts.json:
            opts.out.print(f"[cyan]●[/] {line}")

    result = run_demo(say=say, keep=keep)
    if opts.json:
        emit_json(result)
    else:
        _print_demo(opts, result, keep)
    if not result.get("survived"):
        sys.exit(EXIT_FAILED)


def _print_demo(opts: Opts, result: dict[str, Any], keep: bool) -> None:
    out = opts.out
    notice = result.get("recovered")
    out.print("\n[bold]what came back[/]")
    names: dict[str, str] = {}

    def collect(branches: list[dict[str, Any]]) -> None:
        for b in branches:
            names[b["agent"]["agent_id"]] = b["agent"]["path"]
            collect(b.get("children", []))

    collect(result.get("tree") or [])
    for line in render.recovery_lines(notice, names):
        out.print(f"  {line}")
    verdict = "[green]yes[/]" if result.get("survived") else "[bold red]NO[/]"
    out.print(f"  every acknowledged turn survived: {verdict}")
    out.print(render.agent_tree(result.get("tree") or []))
    for path, turns in (result.get("histories") or {}).items():
        out.print(f"[bold]{esc(path)}[/]: {len(turns)} completed turn(s)")
        for turn in turns[-2:]:
            out.print(f"  [green]>[/] {esc(render.excerpt(turn['prompt'], 60))}")
    fsck_report = result.get("fsck") or {}
    out.print(f"fsck after a clean stop: exit {fsck_report.get('exit_code')}")
    if keep:
        out.print(f"root kept at {esc(result['root'])}")
