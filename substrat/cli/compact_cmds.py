"""``substrat compact``: archive (or delete) the log segments checkpoints cover (offline)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from substrat.cli.common import Opts, emit_json, esc, fail, lazy_module, offline_command
from substrat.words import natural_key, plural

if TYPE_CHECKING:
    from substrat.cli import lines, render
else:
    render = lazy_module("substrat.cli.render")  # rich, loaded when something is drawn
    lines = lazy_module("substrat.cli.lines")  # loaded when a line says something


EXIT_INTERRUPTED = 130
INTERRUPTED = (
    "compact interrupted: nothing lost; segments compacted so far are kept, run it again "
    "to compact the rest"
)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@click.command("compact")
@offline_command()
@click.option("--dry-run", is_flag=True, help="Only show what would be compacted.")
@click.option(
    "--segment-bytes",
    type=click.IntRange(min=1),
    default=None,
    help="Seal an active log file into a segment once it is this big (default 8 MiB).",
)
@click.option(
    "--policy",
    type=click.Choice(["archive", "delete"]),
    default="archive",
    show_default=True,
    help="archive: compress covered segments (nothing is lost). delete: remove the "
    "covered segments before the one holding the newest checkpoint (their turns and the "
    "checkpoint are kept in the log's base, events.base), compress the rest.",
)
def compact(opts: Opts, dry_run: bool, segment_bytes: int | None, policy: str) -> None:
    """Checkpoint every log, then compress (gzip) or delete the sealed segments they cover.

    The root must be stopped (a running daemon compacts by its own policy,
    SUBSTRAT_COMPACTION). --dry-run reads only: per log, its segments, its
    newest checkpoint and what compacting would do with what is checkpointed
    now (compacting checkpoints every log first, so it may do more). Deleted
    entries' turns are still shown by `substrat log` (from the log's base, which
    keeps what conversations and recovery need; it says which entries were
    deleted); their other events are gone. An unreadable log is named with what to
    do (exit 1).
    """
    from substrat import compaction

    if dry_run:
        planned = compaction.plan(opts.root, compaction=policy, segment_bytes=segment_bytes)
        if opts.json:
            emit_json(planned.to_dict())
        else:
            _print_plan(opts, planned, policy)
        sys.exit(1 if any(item.unreadable for item in planned.logs) else 0)
    from substrat import rootdir

    rootdir.prepare_root(opts.root, create=False)  # writable? (one line if not, as fsck --repair)
    try:
        report = compaction.compact(opts.root, segment_bytes=segment_bytes, compaction=policy)
    except KeyboardInterrupt:
        # Each step is crash-safe (a kill -9 anywhere loses nothing): an interrupt is one.
        fail(opts, KeyboardInterrupt(INTERRUPTED), EXIT_INTERRUPTED)
    if opts.json:
        emit_json(report.to_dict())
    else:
        out = opts.out
        if report.recovery is not None:  # it ran the crash recovery: the report is its to give
            for line in lines.recovery_lines(report.recovery, report.recovery["names"]):
                out.print(line)
        out.print(
            f"compact: {plural(report.checkpoints, 'checkpoint')} written, "
            f"{plural(report.sealed, 'segment')} sealed, {report.archived} archived, "
            f"{report.deleted} deleted; "
            f"logs {_size(report.bytes_before)} -> "
            f"{_size(report.bytes_after)}"
        )
        if policy == "delete" and report.archived:
            out.print(KEPT_NEWEST)
        for error in report.errors:
            out.print(f"[red]{esc(error)}[/]")
    sys.exit(1 if report.errors else 0)


KEPT_NEWEST = (
    "delete keeps each log's newest sealed segment (archived): the checkpoint that stands "
    "for the deleted part is in it; it is deleted by a later `substrat compact --policy "
    "delete` once a newer segment is sealed (--segment-bytes)"
)


def _print_plan(opts: Opts, planned: object, policy: str) -> None:
    from rich.padding import Padding

    from substrat.compaction import CompactPlan
    from substrat.compaction import where as compaction_where

    assert isinstance(planned, CompactPlan)
    out = opts.out
    cols = [
        render.Col("LOG", cut=True, min_width=10),
        render.Col("ACTIVE", justify="right"),
        render.Col("SEALED", justify="right"),
        render.Col("ARCHIVED", justify="right"),
        render.Col("CHECKPOINT", justify="right"),
        render.Col("WOULD", cut=True, min_width=10),
    ]
    rows = []
    for who, item in sorted(
        ((item.path or lines.short(item.endpoint), item) for item in planned.logs),
        key=lambda pair: natural_key(pair[0]),
    ):  # as other commands name agents, in their order
        would = [f"delete {len(item.to_delete)}"] if item.to_delete else []
        would += ["seal the active file, archive it"] if item.to_seal else []
        would += [f"archive {len(item.to_archive)}"] if item.to_archive else []
        if item.deleted_through:
            would.append(f"(1-{item.deleted_through} deleted)")
        if item.unreadable is not None:
            would = ["skip (unreadable)"]
        rows.append(
            [
                esc(who),
                _size(item.active_bytes),
                str(item.sealed),
                str(item.archived),
                "-" if item.checkpoint_seq is None else f"seq {item.checkpoint_seq}",
                esc(", ".join(would) or "nothing"),
            ]
        )
    out.print(f"[bold]{esc(opts.root)}[/]")
    out.print(Padding(render.fitted_table(out.width - 2, cols, rows), (0, 0, 0, 2)))
    for item in planned.logs:
        if item.unreadable is not None:
            where = compaction_where(item.endpoint)
            out.print(f"[red]{esc(where)} cannot be read: {esc(item.unreadable)}[/]")
    total = sum(len(p.to_archive) for p in planned.logs)
    going = sum(len(p.to_delete) for p in planned.logs)
    sealing = sum(1 for p in planned.logs if p.to_seal and p.unreadable is None)
    would = [f"{plural(sealing, 'active file')} to seal and archive"] if sealing else []
    would += [f"{plural(going, 'segment')} to delete"] if going else []
    would += [f"{plural(total, 'segment')} to archive"] if total else []
    if not would:  # in the words of the policy asked about
        would = ["nothing to delete yet" if policy == "delete" else "nothing to archive yet"]
    if policy == "delete" and not going and any(p.sealed or p.archived for p in planned.logs):
        would[-1] += " (each log keeps its newest sealed segment until a newer one is sealed)"
    out.print(
        f"{plural(len(planned.logs), 'log')}, {_size(planned.stored_bytes)} on disk; "
        + ", ".join(would)
        + "; nothing was changed (run without --dry-run, the daemon stopped, to compact)"
    )
