"""The power-loss campaign's report: totals, and every cycle's acknowledged and lost work.

A cycle that fails counts like any other: its acknowledged operations are in
the totals, and what its check found lost is named (agents, turns, messages),
in the cycle's line and in the totals. See docs/lazyfs.md, "The report".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from oracle.losses import Lost


@dataclass
class CycleResult:
    """One cycle (or the final restart): what was acknowledged in it and what its check lost."""

    label: str
    """``"1"``, ``"2"``, ... or ``"final"`` (the last restart and clean stop)."""
    acknowledged: int = 0
    """Operations acknowledged during this cycle."""
    cut: str = ""
    """How the power was cut (empty: the cycle stopped before its cut)."""
    in_flight: str = ""
    """The operation in flight at the cut, if any; once checked, ``done: `` or ``undone: ``."""
    lost: Lost = field(default_factory=Lost)
    ok: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "acknowledged": self.acknowledged,
            "cut": self.cut,
            "in_flight": self.in_flight,
            "lost": self.lost.to_dict(),
            "lost_count": self.lost.count,
            "ok": self.ok,
        }


@dataclass
class PowerLossReport:
    """The numbers of one campaign; ``losses`` must be 0."""

    seed: int
    disk: str
    cycles_requested: int
    cycles: int = 0
    """Cycles whose check passed."""
    acknowledged: int = 0
    """Operations acknowledged in every cycle that ran, the failing one included."""
    refused: int = 0
    power_cuts: int = 0
    """Cuts made by SIGKILL followed by a LazyFS clear-cache."""
    lazyfs_crashes: int = 0
    """Cuts made by an armed LazyFS crash fault firing."""
    injections_unfired: int = 0
    """Armed faults that found no matching operation in time (a clear-cache cut followed)."""
    cuts_checked: bool = False
    """Whether each cut was checked to drop an unsynced canary (on LazyFS, by default)."""
    cuts_verified: int = 0
    """Cuts after which the unsynced canary written just before them was gone."""
    in_flight_at_cut: int = 0
    in_flight_applied: int = 0
    lost_turns_reported: int = 0
    redelivered_reported: int = 0
    io_errors_after_lazyfs_crash: int = 0
    errored_but_applied: int = 0
    """Operations answered with an I/O error that recovery nevertheless shows as done."""
    agents_at_end: int = 0
    state_bytes: int = 0
    """Size of the state directories after the last check."""
    turns_at_end: int = 0
    seconds: float = 0.0
    losses: int = 0
    """Acknowledged agents, turns and messages found lost, over every cycle."""
    lost: Lost = field(default_factory=Lost)
    """Each of them, named."""
    cycle_results: list[CycleResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    lazyfs_binary: str = ""
    """The LazyFS that ran (empty on a plain directory)."""
    notes: list[str] = field(default_factory=list)
    """Worth knowing, not failures: e.g. mounts that killed earlier runs left behind."""

    @property
    def ok(self) -> bool:
        return not self.problems and self.cycles == self.cycles_requested

    def record(self, result: CycleResult, acknowledged_so_far: int) -> None:
        """Count a finished (or failed) cycle in the totals."""
        self.cycle_results.append(result)
        self.acknowledged = acknowledged_so_far
        self.lost.add(result.lost)
        self.losses = self.lost.count

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        body["lost"] = self.lost.to_dict()
        body["cycle_results"] = [c.to_dict() for c in self.cycle_results]
        return body | {"ok": self.ok}

    def render(self) -> str:
        ran = len([c for c in self.cycle_results if c.label != "final"])
        failed = any(not c.ok for c in self.cycle_results)
        lines = [
            f"# Power-loss campaign: {'PASS' if self.ok else 'FAIL'}",
            "",
            f"- disk: {self.disk}"
            f"{f' ({self.lazyfs_binary})' if self.lazyfs_binary else ''}, seed {self.seed}, "
            f"{self.seconds:.1f} s",
            f"- cycles: {self.cycles} of {self.cycles_requested} passed ({ran} ran)",
            f"- acknowledged operations: {self.acknowledged} in {ran} cycles"
            f"{', the failing one included' if failed else ''} (cleanly refused: {self.refused})",
            f"- acknowledged and lost: {self.losses}: {self.lost.summary()}",
            f"- cuts: {self.power_cuts} SIGKILL + clear-cache, {self.lazyfs_crashes} LazyFS "
            f"crash faults ({self.injections_unfired} armed faults did not fire in time)",
            f"- cuts that dropped unsynced data: {self.cuts_verified} of "
            f"{self.power_cuts + self.lazyfs_crashes} (a canary written without fsync "
            "just before each cut must be gone after it)"
            if self.cuts_checked
            else "- cuts that dropped unsynced data: not checked (a plain directory has no "
            "power loss)",
            f"- operations in flight at a cut: {self.in_flight_at_cut} "
            f"(done: {self.in_flight_applied}; done or undone, both are allowed: "
            "none was acknowledged)",
            f"- recovery reported: {self.lost_turns_reported} turns lost in flight, "
            f"{self.redelivered_reported} pending messages put back in inboxes",
            f"- I/O errors answered after LazyFS died: {self.io_errors_after_lazyfs_crash} "
            f"(operation done all the same: {self.errored_but_applied})",
            f"- at the end: {self.agents_at_end} live agents, {self.turns_at_end} turns, "
            f"{self.state_bytes / 2**20:.1f} MiB of state",
        ]
        if self.cycle_results:
            lines += ["", "## Cycles", "", "| cycle | acknowledged | cut | in flight | lost |"]
            lines.append("| --- | --- | --- | --- | --- |")
            for c in self.cycle_results:
                verdict = "" if c.ok else " (FAILED)"
                flight = c.in_flight if len(c.in_flight) <= 60 else c.in_flight[:59] + "…"
                lines.append(
                    f"| {c.label}{verdict} | {c.acknowledged} | {c.cut or '-'} | "
                    f"{flight or '-'} | {c.lost.summary() if c.lost.count else '-'} |"
                )
        if self.lost.count:
            lines += ["", "## Lost", "", "```"]
            for kind, labels in self.lost.to_dict().items():
                lines += [f"{kind[:-1] if kind.endswith('s') else kind}: {x}" for x in labels]
            lines.append("```")
        if self.notes:
            lines += ["", "## Notes", ""]
            lines += [f"- {note}" for note in self.notes]
        if self.problems:
            lines += ["", "## Problems", ""]
            lines += ["```", *self.problems, "```"]
        return "\n".join(lines) + "\n"
