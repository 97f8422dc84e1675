"""What explore() hands back: failing images, grouped by their cause, and the report text."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faultfs._arguments import checked
from faultfs._causes import Finding, Step, merge_steps
from faultfs._fs import FaultFS, Snapshot
from faultfs._trace import Op
from faultfs._wording import Where, _listed, describe
from faultfs.errors import ExploreFailed, NondeterministicWorkload, SimulatedCrash

Workload = Callable[[FaultFS], Any]
# The crash point after the workload returned (no boundary is armed for it).
END = -1
END_SITE = "<after the workload returned>"
# How many causes and symptom groups a report prints in full.
REPORT_MAX_ENTRIES = 20
REPORT_MAX_STEPS = 8
"""Operations listed under one cause; a helper writing many files names the first ones."""
DRAWN_NOTE = "file names drawn anew in each run are shown as the longest run drew them"
"""The header's note when a name differs between runs at one operation (drawn_names)."""
# Causes with one fix, whatever the files and the lines (what relied on the step may differ):
# the report shows them as one entry listing each, so a store that repeats its pattern over
# several files (dbm.dumb: .dat, .dir, .bak) reads as the few things to change.
FAMILIES = {
    "unsynced-before-ack": "unsynced",
    "unsynced-data": "unsynced",
    "entry-not-durable": "entry",
    "torn-write": "torn",
}


@dataclass(frozen=True)
class Failure:
    """One crash image on which recovery or its check raised."""

    boundary: int
    phase: str
    op: Op
    mode: str
    image_index: int
    seed: int
    detail: str
    error: str
    traceback: str
    trace: tuple[Op, ...] = field(repr=False)
    acked: tuple[Any, ...] = field(repr=False)
    profile: str = "posix"
    findings: tuple[Finding, ...] = field(default=(), repr=False)

    @property
    def site(self) -> str:
        """Where the crash landed (the symptom): the crashed operation's user frame."""
        return self.op.site

    @property
    def key(self) -> str:
        """Reproduction key: ``report.replay(failure, workload)`` rebuilds the image."""
        where = "end" if self.boundary == END else str(self.boundary)
        return (
            f"profile={self.profile} boundary={where} mode={self.mode} "
            f"image=#{self.image_index} seed={self.seed}"
        )


@dataclass
class Cause:
    """One missing durability step and every failing image it explains."""

    kind: str
    key: tuple[object, ...]
    steps: tuple[Step, ...]
    note: str
    root: str
    failures: list[Failure] = field(default_factory=list, repr=False)

    def describe(self, source_root: str | None = None) -> tuple[str, str]:
        """(summary, fix) with source paths relative to ``source_root``."""
        return describe(self.kind, self.steps, self.note, Where(self.root, source_root))

    @property
    def summary(self) -> str:
        return self.describe()[0]

    @property
    def fix(self) -> str:
        return self.describe()[1]

    @property
    def modes(self) -> dict[str, int]:
        """Failing images per crash mode."""
        return dict(Counter(f.mode for f in self.failures))

    @property
    def profiles(self) -> dict[str, int]:
        return dict(Counter(f.profile for f in self.failures))

    def _merge(self, finding: Finding) -> None:
        self.steps = merge_steps(self.steps, finding.steps)


@dataclass
class ExploreReport:
    """The result of explore(): counts, failing images, and their causes."""

    profiles: tuple[str, ...]
    modes: tuple[str, ...]
    root: str = "/"
    boundaries: int = 0
    images_checked: int = 0
    images_reused: int = 0
    # Extra images cause analysis built and checked (each unsynced operation lost alone).
    images_analysed: int = 0
    failures: list[Failure] = field(default_factory=list)
    bases: dict[str, Snapshot] = field(default_factory=dict, repr=False)
    # Boundaries a re-run never reached (kept only with HealthCheck.nondeterministic suppressed).
    unreached: list[int] = field(default_factory=list)
    # drawn_names of the failures, and how many failures there were then (text() asks thrice).
    _drawn: tuple[int, dict[str, str]] = field(default=(-1, {}), repr=False, compare=False)

    @property
    def profile(self) -> str:
        return ",".join(self.profiles)

    @property
    def ok(self) -> bool:
        return not self.failures

    def drawn_names(self) -> dict[str, str]:
        """:func:`drawn_names` of the failures, kept until a failure is added."""
        if self._drawn[0] != len(self.failures):
            self._drawn = (len(self.failures), drawn_names(self.failures))
        return self._drawn[1]

    def causes(self) -> list[Cause]:
        """Failing images grouped by the missing step behind them, in order of first appearance.

        A cause's steps name files as the longest run named them (:func:`drawn_names`).
        """
        names = self.drawn_names()
        out: dict[tuple[object, ...], Cause] = {}
        for failure in self.failures:
            for finding in failure.findings:
                finding = finding._replace(steps=_named(finding.steps, names))
                cause = out.get(finding.key)
                if cause is None:
                    cause = out[finding.key] = Cause(
                        finding.kind, finding.key, finding.steps, finding.note, self.root
                    )
                else:
                    cause._merge(finding)
                if not cause.failures or cause.failures[-1] is not failure:
                    cause.failures.append(failure)
        return list(out.values())

    def cause_groups(self) -> list[list[Cause]]:
        """Causes with the same fix (``FAMILIES``) together, most failing images first.

        Within a group the causes are in the same order; a cause of a kind no other
        shares is a group of one. Ties keep the order of first appearance.
        """
        grouped: dict[str, list[Cause]] = {}
        for cause in self.causes():
            grouped.setdefault(FAMILIES.get(cause.kind, cause.kind), []).append(cause)
        ordered = [sorted(g, key=lambda c: -len(c.failures)) for g in grouped.values()]
        return sorted(ordered, key=lambda g: -len(_failures_of(g)))

    def groups(self) -> dict[str, list[Failure]]:
        """Failures by where the crash landed (symptoms), in order of first appearance."""
        out: dict[str, list[Failure]] = {}
        for failure in self.failures:
            out.setdefault(failure.site, []).append(failure)
        return out

    def failures_per_mode(self) -> dict[str, int]:
        """Failing images per crash mode (modes without failures are left out)."""
        return _ordered(Counter(f.mode for f in self.failures), self.modes)

    def failures_per_profile(self) -> dict[str, int]:
        """Failing images per file-system profile (profiles without failures are left out)."""
        return _ordered(Counter(f.profile for f in self.failures), self.profiles)

    def modes_failed(self) -> set[str]:
        return {f.mode for f in self.failures}

    def assert_ok(self) -> None:
        """Raise ExploreFailed (an AssertionError) with the report text if anything failed."""
        __tracebackhide__ = True
        if self.failures:
            raise ExploreFailed(self.text())

    def replay(self, failure: Failure, workload: Workload) -> FaultFS:
        """Re-run ``workload`` to ``failure``'s crash point and return its failing image."""
        base = self.bases.get(failure.profile)
        assert base is not None, f"report has no base snapshot for profile {failure.profile}"
        fs = FaultFS.from_snapshot(base)
        if failure.boundary == END:
            with fs:
                workload(fs)
        else:
            run_armed(fs, workload, failure.boundary)
        return fs.crash_image(failure.mode, seed=failure.seed, index=failure.image_index)

    def __str__(self) -> str:
        return self.text(os.getcwd())

    def _entry(self, label: str, cause: Cause, source_root: str | None, where: Where) -> list[str]:
        """One cause: summary, fix, its steps, the images it explains and an example."""
        summary, fix = cause.describe(source_root)
        lines = [f"{label} {summary}", f"    fix: {fix}"]
        lines += [f"    {line}" for line in _step_lines(cause.steps, where)]
        profiles = f"; profiles: {_counts(cause.profiles)}" if len(self.profiles) > 1 else ""
        lines.append(
            f"    seen in {_images(len(cause.failures))} "
            f"({_counts(_ordered(cause.modes, self.modes))}){profiles}"
        )
        # The example shows an image this cause alone explains, if there is one.
        alone = (f for f in cause.failures if len(f.findings) == 1)
        return lines + _example(next(alone, cause.failures[0]), where)

    @checked
    def text(self, source_root: str | None = None) -> str:
        """The report; source paths relative to ``source_root``, file paths to the FaultFS root."""
        where = Where(self.root, source_root)
        causes = self.causes()
        per_mode = _counts(_ordered(self.failures_per_mode(), self.modes))
        lines = [
            f"faultfs explore: profile={self.profile} modes={','.join(self.modes)}",
            f"  {self.boundaries} boundaries, {self.images_checked} images checked "
            f"({self.images_reused} identical images reused"
            + (
                f", {self.images_analysed} more for cause analysis)"
                if self.images_analysed
                else ")"
            ),
        ]
        if not self.failures:
            lines.append("  no failing image")
            return "\n".join(lines)
        unexplained = [f for f in self.failures if not f.findings]
        groups = self.cause_groups()
        tail = f" from {len(causes)} cause{'s' if len(causes) != 1 else ''}" if causes else ""
        if len(groups) < len(causes):
            tail += f" ({len(groups)} fix{'es' if len(groups) != 1 else ''})"
        lines.append(f"  {_images(len(self.failures))} ({per_mode}){tail}")
        if len(self.profiles) > 1:
            lines.append(f"  failing images per profile: {_counts(self.failures_per_profile())}")
        if self.drawn_names():
            lines.append(f"  {DRAWN_NOTE}")
        if len(groups) > 1:
            lines.append("  fix first (most failing images first):")
            for number, group in enumerate(groups[:REPORT_MAX_ENTRIES], start=1):
                fix = _fix(group, where, source_root)
                more = f", {len(group)} causes" if len(group) > 1 else ""
                lines.append(f"    [{number}] {_images(len(_failures_of(group)))}{more}: {fix}")
        for number, group in enumerate(groups[:REPORT_MAX_ENTRIES], start=1):
            lines.append("")
            if len(group) == 1:
                lines += self._entry(f"[{number}]", group[0], source_root, where)
                continue
            head = group[0]
            title, fix = _family(group, where, source_root)
            lines += [
                f"[{number}] {title}: {len(group)} causes, one fix, seen in "
                f"{_images(len(_failures_of(group)))}",
                f"    fix: {fix}",
            ]
            for letter, cause in zip("abcdefghijklmnopqrstuvwxyz", group, strict=False):
                lines.append(
                    f"    [{number}{letter}] {cause.describe(source_root)[0]} "
                    f"({_images(len(cause.failures))})"
                )
            lines.append(f"    the first of them, [{number}a]:")
            lines += self._entry("", head, source_root, where)[2:]
        if unexplained:
            lines += [
                "",
                f"{_images(len(unexplained))} without an analysed cause, by crash site:",
            ]
            by_site: dict[str, list[Failure]] = {}
            for failure in unexplained:
                by_site.setdefault(failure.site, []).append(failure)
            for site, failures in list(by_site.items())[:REPORT_MAX_ENTRIES]:
                modes = _counts(Counter(f.mode for f in failures))
                lines.append(f"  {_short(site, source_root)} ({len(failures)}: {modes})")
                lines += _example(failures[0], where)
        return "\n".join(lines)


def drawn_names(failures: list[Failure]) -> dict[str, str]:
    """Paths that differ between explore's runs at one operation, each mapped to the path the
    longest run gave it.

    Every run is the same workload (the nondeterministic health check holds them to the
    same boundaries), so the n-th operation of two runs, of one kind at one site, is one
    operation: a path that differs there was drawn (mailbox.Maildir's ``time.M…P…Q…``
    names, a uuid4), not chosen. A cause merges runs, and listed every draw: three links
    for Maildir's two messages. Named as one run drew them, each operation reads once,
    and two operations of one run (two messages) stay two. A run that differs in kind or
    site is compared no further.
    """
    if not failures:
        return {}
    longest = max(failures, key=lambda failure: len(failure.trace)).trace
    names: dict[str, str] = {}
    for failure in failures:
        trace = failure.trace
        if trace == longest[: len(trace)]:
            continue  # a state the longest run captured: its names (compared by identity, in C)
        for op, like in zip(trace, longest, strict=False):
            if op.kind != like.kind or op.site != like.site:
                break
            pairs = [(op.path, like.path)]
            if op.kind in ("rename", "link") and op.args and like.args:
                pairs.append((str(op.args[0]), str(like.args[0])))
            names.update((path, other) for path, other in pairs if path != other)
    return names


def _named(steps: tuple[Step, ...], names: dict[str, str]) -> tuple[Step, ...]:
    """``steps`` with their paths (and a rename's target, a link's source) as ``names`` says."""
    if not names:
        return steps
    out = []
    for step in steps:
        args = step.args
        if step.kind in ("rename", "link") and args and str(args[0]) in names:
            args = (names[str(args[0])], *args[1:])
        out.append(step._replace(path=names.get(step.path, step.path), args=args))
    return tuple(out)


def _images(count: int) -> str:
    return f"{count} failing image{'s' if count != 1 else ''}"


def _failures_of(group: list[Cause]) -> list[Failure]:
    """The failing images a group of causes explains, each once."""
    seen: dict[int, Failure] = {}
    for cause in group:
        for failure in cause.failures:
            seen.setdefault(id(failure), failure)
    return list(seen.values())


def _fix(group: list[Cause], where: Where, source_root: str | None) -> str:
    if len(group) == 1:
        return group[0].describe(source_root)[1]
    return _family(group, where, source_root)[1]


# What a group of entries never made durable went through (a rotated log: created, renamed).
_ENTRY_VERBS = (
    ("creating", {"create", "mkdir"}),
    ("renaming", {"rename"}),
    ("linking", {"link"}),
    ("removing", {"unlink", "rmdir"}),
)


def _family(group: list[Cause], where: Where, source_root: str | None) -> tuple[str, str]:
    """(title, fix) of causes with one fix: what went wrong in which files, and the change."""
    files = sorted(
        {
            where.path(step.path)
            for cause in group
            for step in cause.steps
            if step.role not in ("then", "acknowledged") and step.path
        }
    )
    names = _listed(files)  # the first few: each cause below names its own (Maildir's 40 links)
    kind = group[0].kind
    if kind == "entry-not-durable":
        dirs = sorted({os.path.dirname(name) or "." for name in files})
        where_to = f"director{'ies' if len(dirs) > 1 else 'y'} ({', '.join(dirs)})"
        kinds = {s.kind for c in group for s in c.steps if s.role not in ("then", "acknowledged")}
        doing = " or ".join(verb for verb, of in _ENTRY_VERBS if kinds & of) or "creating"
        them = "them" if len(files) > 1 else "it"
        return f"entries never made durable ({names})", (
            f"fsync the {where_to} after {doing} {names}, before anything relies on {them} "
            "(each cause below names what did)"
        )
    if kind == "torn-write":
        return f"writes torn by the crash ({names})", group[0].describe(source_root)[1]
    if kind == "lost-together":  # (not "data never fsynced": renames and creates are in it)
        return f"unsynced operations lost together ({names})", (
            f"fsync {names}, and their directories, before anything relies on them (each "
            "cause below names the operations)"
        )
    return f"data never fsynced ({names})", (
        f"fsync {names} after writing, before anything relies on the data (each cause below "
        "names what did)"
    )


def _ordered(counter: dict[str, int], order: tuple[str, ...]) -> dict[str, int]:
    return {name: counter[name] for name in order if name in counter}


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counter.items())


def _short(site: str, source_root: str | None) -> str:
    if source_root and site.startswith(source_root.rstrip("/") + "/"):
        return site[len(source_root.rstrip("/")) + 1 :]
    return site


def _step_lines(steps: tuple[Step, ...], where: Where) -> list[str]:
    """A cause's steps, at most REPORT_MAX_STEPS operations, then what relied on them."""
    anchors = [s for s in steps if s.role in ("then", "acknowledged")]
    done = [s for s in steps if s.role not in ("then", "acknowledged")]
    lines = [_step_line(s, where) for s in done[:REPORT_MAX_STEPS]]
    if len(done) > REPORT_MAX_STEPS:
        lines.append(f"... and {len(done) - REPORT_MAX_STEPS} more operations like these")
    return lines + [_step_line(s, where) for s in anchors]


def _step_line(step: Step, where: Where) -> str:
    if step.kind == "ack":
        return f"acknowledged at {where.frames(step)}"
    if step.kind == "check":
        return f"recovery failed at {where.frames(step)}"
    if step.kind == "rename" and step.args:
        what = f"rename {where.path(step.path)} -> {where.path(str(step.args[0])[3:])}"
    elif step.kind == "link" and step.args:
        what = f"link {where.path(str(step.args[0]))} -> {where.path(step.path)}"
    else:
        what = " ".join([step.kind, where.path(step.path), *map(str, step.args)])
    if step.role == "retried fsync":
        what += " (retried)"
    return f"{what} at {where.frames(step)}"


def _example(failure: Failure, where: Where) -> list[str]:
    if failure.boundary == END:
        crash = "after the workload returned"
    else:
        crash = f"{failure.phase} {failure.op.kind} {where.path(failure.op.path)}"
    return [
        f"    e.g. {failure.key}: crash {crash}",
        f"      image: {failure.detail}",
        f"      error: {_relative(failure.error, where.root)}",
    ]


def _relative(text: str, root: str) -> str:
    """``text`` with paths under the FaultFS root made relative, continuation lines indented."""
    text = text.replace(root + "/", "").replace(root, ".")
    return text.replace("\n", "\n             ")


def run_armed(fs: FaultFS, workload: Workload, boundary: int) -> None:
    """Run ``workload`` on ``fs`` with a crash armed at ``boundary``; it must get there."""
    fs.arm(boundary)
    try:
        with fs:
            workload(fs)
    except SimulatedCrash:
        pass
    if not fs.crashed:
        raise NondeterministicWorkload(
            f"the workload passed {fs.boundaries} boundaries this time and never reached "
            f"boundary {boundary}; make it deterministic (seeded randomness, fresh state per run)"
        )
