"""Tables and trees for people (``--json`` bypasses all of this); their text in
:mod:`substrat.cli.lines`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import JustifyMethod, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from substrat.cli.common import esc
from substrat.cli.lines import endpoint, excerpt, short, state
from substrat.words import when

GAP = 2
"""Spaces between table columns."""


@dataclass(frozen=True)
class Col:
    """A table column and how it gives way on a narrow terminal."""

    header: str
    cut: bool = False
    """May be shortened with an ellipsis (free text); names and ids never are."""
    fold: bool = False
    """May be narrowed like a cut column, its cells wrapping onto more lines instead of
    being cut (paths and details a user must see whole)."""
    drop: int = 0
    """May be left out when even cutting is not enough; the highest goes first."""
    justify: JustifyMethod = "left"
    min_width: int = 8


def fitted_table(width: int, cols: list[Col], rows: list[list[str]]) -> Table:
    """A table within ``width`` columns, one line per row unless a column folds.

    Cells never wrap, except in fold columns. Free-text columns give way first
    (cut with an ellipsis, or folded onto more lines), then optional columns
    are left out; names and ids are always shown whole. Cells are rich markup.
    """
    shown, widths = fit_widths(width, cols, rows)
    return _table(cols, rows, shown, widths)


def fit_widths(width: int, cols: list[Col], rows: list[list[str]]) -> tuple[list[int], list[int]]:
    """Which columns to show and how wide, so that every row fits within ``width``."""
    natural = [Text(c.header).cell_len for c in cols]
    for row in rows:
        assert len(row) == len(cols)
        for i, cell in enumerate(row):
            natural[i] = max(natural[i], Text.from_markup(cell).cell_len)
    shown = list(range(len(cols)))
    widths = list(natural)

    def total() -> int:
        return sum(widths[i] for i in shown) + GAP * (len(shown) - 1)

    # A cut (or fold) column keeps its header whole and at least its min_width.
    floor = [max(c.min_width, Text(c.header).cell_len) for c in cols]
    while True:
        excess = total() - width
        while excess > 0:  # take from the widest cuttable column, one cell at a time
            slack = [i for i in shown if (cols[i].cut or cols[i].fold) and widths[i] > floor[i]]
            if not slack:
                break
            widest = max(slack, key=lambda i: widths[i] - floor[i])
            widths[widest] -= 1
            excess -= 1
        if excess <= 0:
            break
        droppable = [i for i in shown if cols[i].drop]
        if not droppable:
            break  # names alone are wider than the terminal: shown whole all the same
        shown.remove(max(droppable, key=lambda i: cols[i].drop))
        widths = [natural[i] for i in range(len(cols))]
    return shown, widths


def fits(width: int, cols: list[Col], rows: list[list[str]]) -> bool:
    """Whether :func:`fit_widths` gets every row within ``width`` (else rich would cut
    even the columns that are never cut)."""
    shown, widths = fit_widths(width, cols, rows)
    return sum(widths[i] for i in shown) + GAP * (len(shown) - 1) <= width


def _table(
    cols: list[Col],
    rows: list[list[str]],
    shown: list[int],
    widths: list[int],
    *,
    header: bool = True,
) -> Table:
    table = Table(
        box=None,
        header_style="bold",
        pad_edge=False,
        padding=(0, GAP, 0, 0),
        show_header=header,
    )
    for i in shown:
        col = cols[i]
        table.add_column(
            col.header,
            no_wrap=not col.fold,
            overflow="fold" if col.fold else "ellipsis",
            width=widths[i],
            justify=col.justify,
        )
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table


def grouped_tables(
    width: int, cols: list[Col], groups: list[tuple[str, list[list[str]]]], indent: int = 2
) -> list[RenderableType]:
    """One title line per group (a name, never cut) and its rows, aligned across groups."""
    rows = [row for _, group in groups for row in group]
    shown, widths = fit_widths(width - indent, cols, rows)
    out: list[RenderableType] = []
    if not groups:
        return out
    out.append(Padding(_table(cols, [], shown, widths), (0, 0, 0, indent)))
    for title, group in groups:
        out.append(title)
        body = _table(cols, group, shown, widths, header=False)
        out.append(Padding(body, (0, 0, 0, indent)))
    return out


def agents_table(agents: list[dict[str, Any]], width: int) -> Table:
    ended = any(a.get("terminated_at") for a in agents)
    cols = [
        Col("PATH"),
        Col("ID"),
        Col("STATE"),
        Col("PROVIDER", cut=True, drop=1),
        Col("CHILDREN", justify="right", drop=2),
        Col("INBOX", justify="right", drop=3),
    ]
    if ended:
        cols.append(Col("TERMINATED", drop=4))
    rows = []
    for a in agents:
        dead = a["state"] == "terminated"
        row = [
            esc(a["path"]),
            short(a["agent_id"]),
            state(a["state"]),
            esc(f"{a['provider']}/{a['model']}"),
            "-" if dead else str(len(a.get("children") or [])),
            "-" if dead else str(a.get("pending_messages", 0)),
        ]
        if ended:
            row.append(esc(when(a.get("terminated_at"))[:16]) if dead else "")
        rows.append(row)
    return fitted_table(width, cols, rows)


def agent_tree(branches: list[dict[str, Any]]) -> Tree:
    tree = Tree("[bold]agents[/]", guide_style="dim")

    def add(parent: Tree, branch: dict[str, Any]) -> None:
        a = branch["agent"]
        label = f"[bold]{esc(a['name'])}[/] [dim]{short(a['agent_id'])}[/] {state(a['state'])}"
        if a.get("pending_messages"):
            label += f" [cyan]✉ {a['pending_messages']}[/]"
        # One line per agent: on a narrow terminal the tail is cut, never the name.
        text = Text.from_markup(label, overflow="ellipsis")
        text.no_wrap = True
        node = parent.add(text)
        for child in branch.get("children", []):
            add(node, child)

    for branch in branches:
        add(tree, branch)
    return tree


def messages_table(messages: list[dict[str, Any]], names: dict[str, str], width: int) -> Table:
    cols = [Col("FROM"), Col("KIND"), Col("ID", drop=1), Col("MESSAGE", cut=True, min_width=16)]
    rows = [
        [
            esc(endpoint(m["sender"], names)),
            esc(m["kind"]),
            short(m["message_id"]),
            esc(excerpt(m["payload"])),
        ]
        for m in messages
    ]
    return fitted_table(width, cols, rows)
