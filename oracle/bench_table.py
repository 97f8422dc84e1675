"""The benchmark table's rows and their rendering, and interleaved rounds of measurements.

Shared by the row builders (:mod:`oracle.bench_fuzz`, :mod:`oracle.bench_io`,
:mod:`oracle.bench_scale`, :mod:`oracle.bench_checkpoints`) and the command
(:mod:`oracle.bench`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

GIB = 1 << 30
MIB = 1 << 20


@dataclass
class Row:
    measure: str
    figure: float
    unit: str
    baseline_name: str
    baseline: float | None
    higher_is_better: bool = True
    target: str = ""
    met: bool | None = None
    spread: tuple[float, float] | None = None
    """Lowest and highest round of ``figure`` (which is then the rounds' median)."""
    baseline_spread: tuple[float, float] | None = None

    @property
    def ratio(self) -> float | None:
        if self.baseline in (None, 0):
            return None
        assert self.baseline is not None
        return self.figure / self.baseline


def median_rounds(
    functions: dict[str, Callable[[], float | None]], rounds: int
) -> dict[str, tuple[float, float, float] | None]:
    """Run every function once per round, in the same order each round.

    Returns name -> (median, lowest, highest) over the rounds (None if any
    round gave None). Interleaving puts each figure and its baseline under the
    same load, which on a shared machine moves by 2x from minute to minute.
    """
    seen: dict[str, list[float | None]] = {name: [] for name in functions}
    for _ in range(rounds):
        for name, function in functions.items():
            seen[name].append(function())
    out: dict[str, tuple[float, float, float] | None] = {}
    for name, values in seen.items():
        got = [v for v in values if v is not None]
        out[name] = (
            (statistics.median(got), min(got), max(got)) if len(got) == len(values) else None
        )
    return out


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if unit == "MiB":
        return f"{value:,.0f} MiB"
    if value >= 100:
        text = f"{value:,.0f}"
    elif value >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".strip()


def _spread(value: float | None, spread: tuple[float, float] | None, unit: str) -> str:
    if value is None or spread is None:
        return _fmt(value, unit)
    return f"{_fmt(value, unit)} ({_fmt(spread[0])}-{_fmt(spread[1])})"


def render(rows: list[Row]) -> str:
    """The markdown table; a figure with a spread is a median (lowest-highest round)."""
    lines = [
        "| # | measure | figure | baseline (same run) | baseline | ratio | target | met |",
        "|---|---|---:|---|---:|---:|---|---|",
    ]
    for index, row in enumerate(rows, start=1):
        ratio = row.ratio
        met = "" if row.met is None else ("yes" if row.met else "**no**")
        lines.append(
            f"| {index} | {row.measure} | {_spread(row.figure, row.spread, row.unit)} | "
            f"{row.baseline_name} | {_spread(row.baseline, row.baseline_spread, row.unit)} | "
            f"{'n/a' if ratio is None else f'{ratio:.2f}x'} | {row.target} | {met} |"
        )
    return "\n".join(lines)
