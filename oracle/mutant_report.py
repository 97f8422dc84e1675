"""Results of a mutant run: statuses, the reviewed allow-list, the table and its summary.

Statuses (:class:`MutantResult.status`):

* ``killed``: a durability or recovery check failed (see ``oracle._mutant_guard``);
* ``raised``: a test failed on an exception rather than a check's assertion
  (the code under test raised, say a file it needs is missing, or a test's look
  at the recovered state did, say an agent recovery lost): detected, but
  counted apart from the kills by checks;
* ``harness``: tests failed, but only harness checks (a crash point that moved,
  a changed boundary count); no kill;
* ``survived``: every test passed;
* ``allowed``: survived (or harness only), and the allow-list in docs/mutants.md
  gives the reviewed reason why nothing is lost;
* ``timeout`` and ``error``: no verdict.

A run fails (exit 1) on ``survived``, ``harness`` or ``timeout``, and on an
allow-list entry whose mutant was killed or no longer exists (the list must
stay true); exit 2 on errors.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

KILLED, RAISED, HARNESS = "killed", "raised", "harness"
SURVIVED, ALLOWED, TIMEOUT, ERROR = "survived", "allowed", "timeout", "error"
STATUSES = (KILLED, RAISED, HARNESS, ALLOWED, SURVIVED, TIMEOUT, ERROR)
ALLOW_START = "<!-- allow-list:start -->"
ALLOW_END = "<!-- allow-list:end -->"
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$")


@dataclass
class MutantResult:
    name: str
    description: str
    file: str
    status: str
    killer: str | None = None
    """Node id of the first failing check (``killed``) or test (``harness``)."""
    message: str = ""
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def load_allow_list(path: Path) -> dict[str, str]:
    """Mutant name -> reviewed reason, from the table between the allow-list markers.

    Raises ValueError for a row without a reason or a name listed twice.
    """
    text = path.read_text(encoding="utf-8")
    if ALLOW_START not in text or ALLOW_END not in text:
        return {}
    body = text.split(ALLOW_START, 1)[1].split(ALLOW_END, 1)[0]
    allowed: dict[str, str] = {}
    for line in body.splitlines():
        match = _ROW.match(line.strip())
        if match is None:
            continue
        name = match.group(1)
        reason = " ".join(cell.strip() for cell in match.group(2).split("|")).strip()
        if not reason:
            raise ValueError(f"{path}: allow-list entry {name} gives no reason")
        if name in allowed:
            raise ValueError(f"{path}: {name} is listed twice in the allow-list")
        allowed[name] = reason
    return allowed


def apply_allow_list(results: Sequence[MutantResult], allowed: dict[str, str]) -> list[str]:
    """Mark allow-listed survivors ``allowed``; returns the stale entries (killed or gone)."""
    by_name = {r.name: r for r in results}
    stale = []
    for name, reason in allowed.items():
        result = by_name.get(name)
        if result is None:
            continue  # not in this run (--only, or the catalog)
        if result.status in (SURVIVED, HARNESS):
            result.status = ALLOWED
            result.message = reason
        elif result.status in (KILLED, RAISED):
            stale.append(f"{name} is allow-listed but was killed by {result.killer}")
    return stale


def missing_entries(names: Sequence[str], allowed: dict[str, str]) -> list[str]:
    """Allow-list entries naming a mutant that the code no longer has."""
    present = set(names)
    return [
        f"{name} is allow-listed but no such mutant exists"
        for name in allowed
        if name not in present
    ]


def exit_status(results: Sequence[MutantResult], stale: Sequence[str] = ()) -> int:
    statuses = {r.status for r in results}
    if statuses & {SURVIVED, HARNESS, TIMEOUT} or stale:
        return 1
    if ERROR in statuses:
        return 2
    return 0


def counts(results: Sequence[MutantResult]) -> dict[str, int]:
    return {status: sum(r.status == status for r in results) for status in STATUSES}


def summary(results: Sequence[MutantResult], total_s: float) -> str:
    n = counts(results)
    total = len(results)
    share = 100.0 * n[KILLED] / total if total else 0.0
    parts = [f"{n[s]} {s}" for s in STATUSES if n[s]]
    return (
        f"{n[KILLED]}/{total} killed by real checks ({share:.0f}%); "
        f"{', '.join(parts)}; {total_s / 60:.1f} min wall time"
    )


def _detail(r: MutantResult) -> str:
    return r.killer or (r.message.splitlines()[0] if r.message else "")


def markdown(results: Sequence[MutantResult], total_s: float, title: str) -> str:
    """The result table as Markdown (the CI artifact)."""
    lines = [f"## {title}", "", summary(results, total_s), ""]
    lines += ["| mutant | result | killed by / reason | time |", "| --- | --- | --- | --- |"]
    for r in results:
        detail = _detail(r).replace("|", "\\|")
        lines.append(f"| `{r.name}` | {r.status} | {detail} | {r.duration_s:.0f}s |")
    return "\n".join(lines) + "\n"


def render_table(results: Sequence[MutantResult], total_s: float, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    styles = {
        KILLED: "green",
        RAISED: "blue",
        ALLOWED: "cyan",
        HARNESS: "yellow",
        SURVIVED: "bold red",
        TIMEOUT: "yellow",
        ERROR: "bold magenta",
    }
    table = Table(title=title)
    for column in ("mutant", "result", "killed by / reason", "time"):
        table.add_column(column, justify="right" if column == "time" else "left")
    for r in results:
        table.add_row(
            r.name, f"[{styles[r.status]}]{r.status}[/]", _detail(r), f"{r.duration_s:.1f}s"
        )
    # Wide when piped (CI logs), so node ids are not folded into several lines.
    console = Console(width=None if sys.stdout.isatty() else 220)
    console.print(table)
    console.print(summary(results, total_s))
    for r in results:
        if r.status in (ERROR, TIMEOUT, SURVIVED, HARNESS) and r.message:
            console.print(f"[bold]{r.name}[/]: {r.message}", markup=True, highlight=False)
