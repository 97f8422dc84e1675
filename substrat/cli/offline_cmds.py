"""``substrat fsck``, ``substrat recover`` and ``substrat demo``: no daemon needed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from substrat import rootdir
from substrat.cli.common import (
    EXIT_FAILED,
    Opts,
    RootPath,
    emit_json,
    esc,
    group_json,
    group_root,
    guarded,
    lazy_module,
    offline_command,
)
from substrat.errors import BadInputError, FsckError, RootLockedError
from substrat.shellword import shell_word, shown
from substrat.words import plural

if TYPE_CHECKING:
    from rich.console import RenderableType

    from substrat.cli import lines, render
else:
    render = lazy_module("substrat.cli.render")  # rich, loaded when something is drawn
    lines = lazy_module("substrat.cli.lines")  # loaded when a line says something

SEVERITY_STYLE = {"damage": "bold red", "leftover": "yellow", "notice": "dim"}


@click.command("fsck")
@offline_command()
@click.option("--repair", is_flag=True, help="Repair what is found (the daemon must be stopped).")
@click.option(
    "--acknowledge",
    "acknowledge",
    type=click.IntRange(min=1),
    multiple=True,
    metavar="ID",
    help="Acknowledge open incident ID (fsck lists them), then check; repeatable.",
)
def fsck(opts: Opts, repair: bool, acknowledge: tuple[int, ...]) -> None:
    """Check a stopped root offline: logs, records, pending and temp files, orphans.

    Without --repair nothing on disk changes, except the acknowledgements that
    --acknowledge records: an incident (entries found missing from a log, say) is
    reported at every start and by every check until it is acknowledged. Exit
    codes: 0 clean (notices allowed), 1 damage or leftovers found (repaired, with
    --repair), 2 the check could not run.
    """
    from substrat import fsck as fsck_mod

    if repair or acknowledge:  # refused before anything is written, as daemon start, compact
        rootdir.check_inbox_not_a_root(
            opts.root, "repair" if repair else "acknowledge an incident in"
        )
        rootdir.prepare_root(opts.root, create=False)  # writable? (an old root gets its marker)
    report = fsck_mod.check(opts.root, repair=repair, acknowledge=acknowledge)
    if opts.json:
        emit_json(report.to_dict())
        sys.exit(report.exit_code)
    out = opts.out
    for incident in report.acknowledged:  # durable: it is not reported again
        out.print(f"acknowledged incident {incident['id']} ({esc(incident['log'])})")
    out.print(
        f"fsck {esc(shown(report.root))}: {plural(report.sessions, 'session')}, "
        f"{plural(report.logs, 'log')}, {plural(report.entries, 'entry', 'entries')}"
    )
    if report.findings:
        for part in _findings(report, repair, out.width):
            out.print(part)
    for f in report.problems:
        if f.repair is None:  # nothing fsck can do: the advice in full, never cut to fit
            out.print(f"[bold red]{esc(f.kind)}[/] {esc(f.path)}: {esc(f.detail)}")
    problems = report.problems
    if not problems:
        out.print("[green]clean[/]")
    elif repair:
        left = [f for f in problems if not f.repaired]
        out.print(
            f"[bold]{plural(len(problems), 'problem')} found, "
            f"{len(problems) - len(left)} repaired[/]"
            + (f", [red]{len(left)} left[/]" if left else "")
        )
        if report.recovery:
            for line in lines.recovery_lines({"report": report.recovery}, report.agent_paths):
                out.print(f"  {line}")
    else:
        out.print(
            f"[bold red]{plural(len(problems), 'problem')} found[/]; nothing was changed "
            f"(repair with `substrat fsck --repair --root {esc(shell_word(report.root))}`)"
        )
    sys.exit(report.exit_code)


@click.command("recover")
@offline_command()
@click.option("--dry-run", is_flag=True, help="Only show what recovery would do.")
def recover(opts: Opts, dry_run: bool) -> None:
    """What recovery does to a root, per agent (the daemon runs it at every start).

    --dry-run reads only: last completed turn, the turn lost in flight, the
    messages to redeliver and the effects to reconcile. Without it, recovery
    runs now, offline (the daemon must be stopped).
    """
    from substrat import recovery

    if dry_run:
        plan = recovery.analyze(opts.root).to_dict()
        if opts.json:
            emit_json(plan)
        else:
            _print_plan(opts, plan)
        return
    rootdir.prepare_root(opts.root, create=False)
    rootdir.check_inbox_not_a_root(opts.root, "recover")
    import asyncio

    data, names = asyncio.run(_recover_now(opts.root))
    if opts.json:
        emit_json(data)
    else:
        for line in lines.recovery_lines({"report": data}, names):
            opts.out.print(line)


async def _recover_now(root: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The recovery report, and each agent's path by id (its lines name agents as a
    start's do)."""
    from substrat.daemon import as_reported
    from substrat.orchestrator import Orchestrator
    from substrat.rpc.lock import RootLock, offline_work

    try:
        held = RootLock.acquire(root, retry_s=0)
    except RootLockedError as exc:
        if offline_work(root) is not None:  # it names the offline command, when to retry
            raise FsckError(str(exc)) from None
        raise FsckError(f"{exc} (the running daemon has already recovered this root)") from None
    try:
        orch = await Orchestrator.open(root)
        report = orch.recovery_report
        names = {a.agent_id: a.path for a in orch.agents(include_terminated=True)}
        await orch.close()
        held.mark_recovered("substrat recover")
        data = as_reported(report.to_dict() if report is not None else {}, held.previous_shutdown)
        return data, names
    finally:
        held.release()


def _findings(report: Any, repair: bool, width: int) -> list[RenderableType]:
    """The findings grouped by agent (its path on a line of its own, never cut).

    A table where it fits with every file name whole; on a terminal too narrow for
    that, each finding's file on a line of its own and the rest below it (a name
    folded mid-word, ``daemon.soc`` over ``k``, is not a name one can type).
    """
    cols = [
        render.Col("SEVERITY"),
        render.Col("KIND"),
        render.Col("FILE"),  # whole: a user acts on the path (a missing fsync, a file to remove)
        render.Col("DETAIL", fold=True, min_width=16),
        render.Col("REPAIRED" if repair else "REPAIR", fold=not repair, drop=1),
    ]
    groups: dict[str, list[list[str]]] = {}
    for f in report.findings:
        style = SEVERITY_STYLE.get(f.severity, "white")
        if repair and f.severity != "notice":
            fix = "[green]yes[/]" if f.repaired else "[red]no[/]"
        else:
            fix = esc(f.repair or "-")
        parts = Path(f.path).parts
        if len(parts) > 2 and parts[0] == "agents":
            title = f"[bold]{esc(f.agent)}[/] [dim](session {lines.short(parts[1])})[/]"
            if not f.agent:
                title = f"[bold]session {esc(parts[1])}[/] [dim](no agent.created)[/]"
            shown = str(Path(*parts[2:]))
        else:
            title, shown = "[bold]the root[/]", f.path
        groups.setdefault(title, []).append(
            [f"[{style}]{f.severity}[/]", esc(f.kind), esc(shown), esc(f.detail), fix]
        )
    indent = 2
    if render.fits(width - indent, cols, [row for rows in groups.values() for row in rows]):
        return render.grouped_tables(width, cols, list(groups.items()), indent)
    from rich.padding import Padding
    from rich.text import Text

    def wrapped(markup: str) -> RenderableType:  # at spaces, within the width, indented
        text = Text.from_markup(markup, overflow="fold")
        text.no_wrap = False  # over the console's soft wrap, which would crop it
        return Padding(text, (0, 0, 0, 2 * indent), expand=False)

    out: list[RenderableType] = []
    for title, rows in groups.items():
        out.append(title)
        for severity, kind, name, detail, fix in rows:
            # unwrapped (the console's soft wrap): only a name wider than the terminal breaks
            out.append(f"{' ' * indent}{name}")
            out.append(wrapped(f"{severity} {kind}: {detail}"))
            if fix != "-":
                out.append(wrapped(f"{'repaired' if repair else 'repair'}: {fix}"))
    return out


PLAN_STATUS = {
    "live": "live",
    "terminated": "terminated",
    "spawn to roll forward": "to spawn",
    "orphan (will be terminated)": "orphan",
    "record to rebuild from the log": "to rebuild",
    "will be terminated (an ancestor was terminated)": "to terminate",
    "will be terminated (a committed turn ordered it)": "to terminate",
    "unreadable": "unreadable",
    "held (an ancestor is unreadable)": "held",
    "lost (its log is gone)": "lost",
}
"""Short words for the table; ``--json`` keeps the full status."""


def _print_plan(opts: Opts, plan: dict[str, Any]) -> None:
    """Per agent (by path, on a line of its own), what recovery would do."""
    out = opts.out
    cols = [
        render.Col("STATUS"),
        render.Col("LAST COMPLETED", cut=True, min_width=12),
        render.Col("LOST IN FLIGHT", cut=True, min_width=14),
        render.Col("REDELIVER", justify="right"),
        render.Col("RECONCILE", justify="right"),
        render.Col("DAMAGE", cut=True, min_width=6, drop=1),
    ]
    groups = []
    for a in sorted(plan["agents"], key=lambda a: (a.get("path") or "~", a["session_id"])):
        last = a.get("last_completed_turn") or {}
        lost = a.get("lost_turn") or {}
        damage = ", ".join(f"{k}={v}" for k, v in sorted((a.get("damage") or {}).items()))
        name = a.get("path") or a.get("name")
        title = f"[bold]{esc(name)}[/]" if name else "[bold]?[/] [dim](no agent.created)[/]"
        row = [
            esc(PLAN_STATUS.get(a["status"], a["status"])),
            esc(f"{last.get('turn_id')}: {lines.excerpt(last.get('prompt', ''), 40)}")
            if last
            else "-",
            f"[red]{esc(lost.get('turn_id'))}: {esc(lines.lost_prompt(lost, 40))}[/]"
            + (
                " [dim](outcome unknown: a damaged line follows it)[/]"
                if lost.get("record_damaged")
                else ""
            )
            if lost
            else "-",
            str(len(a.get("to_redeliver") or [])),
            str(len(a.get("to_reconcile") or [])),
            esc(damage or "-"),
        ]
        groups.append((f"{title} [dim](session {lines.short(a['session_id'])})[/]", [row]))
    if plan["agents"]:
        for part in render.grouped_tables(out.width, cols, groups):
            out.print(part)
    else:
        out.print("no sessions under this root")
    if plan.get("user_pending"):
        count = plural(len(plan["user_pending"]), "message")
        out.print(f"user inbox: {count} to redeliver")
    for q in plan.get("quarantined", []):
        if q.get("kind") == "nested_root":  # another root: never moved
            out.print(f"[yellow]left in place:[/] agents/{esc(q['name'])} ({esc(q['reason'])})")
        else:
            out.print(f"[yellow]to quarantine:[/] {esc(q['name'])} ({esc(q['reason'])})")
    for sid in plan.get("roots_to_register", []):
        out.print(f"root to register: {lines.short(sid)}")
    for line in lines.problem_lines(plan):
        out.print(line)


@click.command("demo")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.option("--keep", is_flag=True, help="Keep the temporary root (its path is printed).")
@click.option(
    "--root",
    type=RootPath(),
    default=None,
    help="Run the demo in this new or empty directory, and keep it (default: a temporary "
    "one; $SUBSTRAT_HOME is never used, the demo kills daemons).",
)
def demo(as_json: bool, keep: bool, root: Path | None) -> None:
    """Watch a daemon get SIGKILLed mid-run and come back, on a root of its own.

    Exits 1 if an acknowledged turn did not survive (it never should).
    """
    import tempfile  # with shutil, random and the compressors: only the demo's

    where = root or group_root()
    opts = Opts(
        root=where.expanduser().absolute() if where else Path(tempfile.gettempdir()),
        json=as_json or group_json(),
        creates_root=None,
    )
    guarded(opts, _demo, keep=keep, own_root=where is not None)


def _demo(opts: Opts, keep: bool, own_root: bool) -> None:
    from substrat import rootdir
    from substrat.demo import run_demo

    def say(line: str) -> None:
        if not opts.json:
            opts.out.print(f"[cyan]●[/] {line}")

    if own_root:
        state = rootdir.inspect(opts.root).state
        if state not in (rootdir.RootState.MISSING, rootdir.RootState.EMPTY):
            raise BadInputError(
                f"the demo needs a new or empty directory (it starts, kills and restarts a "
                f"daemon there); {opts.root} is not empty. Pick another path, or leave out "
                "--root for a temporary one"
            )
        rootdir.refuse_foreign(opts.root)  # not inside another root, not too long a path
        keep = True
    result = run_demo(opts.root if own_root else None, say=say, keep=keep)
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
    for line in lines.recovery_lines(notice, names):
        out.print(f"  {line}")
    verdict = "[green]yes[/]" if result.get("survived") else "[bold red]NO[/]"
    out.print(f"  every acknowledged turn survived: {verdict}")
    out.print(render.agent_tree(result.get("tree") or []))
    for path, turns in (result.get("histories") or {}).items():
        out.print(f"[bold]{esc(path)}[/]: {plural(len(turns), 'completed turn')}")
        for turn in turns[-2:]:
            out.print(f"  [green]>[/] {esc(lines.excerpt(turn['prompt'], 60))}")
    fsck_report = result.get("fsck") or {}
    out.print(f"fsck after a clean stop: exit {fsck_report.get('exit_code')}")
    if keep:
        out.print(f"root kept at {esc(shown(result['root']))}")
