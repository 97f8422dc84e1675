"""Health checks: explore and the pytest fixtures refuse to pass a test that checked nothing.

Like Hypothesis's health checks, each one fails the run with a message saying
what to do, and each can be suppressed by name
(``suppress_health_check=[HealthCheck.no_boundaries]``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from faultfs import _swallowed
from faultfs.errors import ConfigError, EscapeError, FailedHealthCheck, NondeterministicWorkload

if TYPE_CHECKING:
    from faultfs._fs import FaultFS
    from faultfs._trace import Op


class HealthCheck(enum.Enum):
    """What explore and the pytest fixtures check before trusting a passing run."""

    #: The workload passed no boundary under the root: there was nothing to crash.
    no_boundaries = "no_boundaries"
    #: The workload or the check used paths outside the root (refused or passed through).
    outside_root = "outside_root"
    #: The check never looked at a crash image (no call under the image's root).
    check_never_ran = "check_never_ran"
    #: Two runs of the workload from the same start passed different operations.
    nondeterministic = "nondeterministic"
    #: Nothing was acknowledged (no fs.ack, no acknowledging): no crash could lose anything.
    nothing_acknowledged = "nothing_acknowledged"
    #: The check rejects the starting state (before the workload, nothing acknowledged).
    check_fails_at_start = "check_fails_at_start"

    @classmethod
    def all(cls) -> list[HealthCheck]:
        return list(cls)


def suppressed(names: Iterable[HealthCheck | str]) -> frozenset[HealthCheck]:
    """The suppressed checks, accepting members or their names."""
    out = set()
    for item in names:
        if isinstance(item, HealthCheck):
            out.add(item)
        elif isinstance(item, str) and item in HealthCheck.__members__:
            out.add(HealthCheck[item])
        else:
            raise ConfigError(
                f"suppress_health_check got {item!r}; use members of faultfs.HealthCheck: "
                f"{[h.name for h in HealthCheck]}"
            )
    return frozenset(out)


def fail(check: HealthCheck, problem: str, advice: str) -> FailedHealthCheck:
    return FailedHealthCheck(
        f"faultfs health check {check.name} failed: {problem}\n{advice}\n"
        f"If this is what you meant, suppress it: "
        f"suppress_health_check=[faultfs.HealthCheck.{check.name}].",
        check,
    )


def check_escapes(fs: FaultFS) -> None:
    """Raise the first escape (a real call under the root) ``fs`` recorded, even if swallowed."""
    if fs.escapes:
        raise EscapeError(fs.escapes[0])
    _swallowed.check(fs)  # an acknowledgement after the crash, refused and swallowed


def check_outside(
    fs: FaultFS, who: str, off: frozenset[HealthCheck], machine: bool = False
) -> None:
    if HealthCheck.outside_root in off or not fs.outside_calls:
        return
    examples = "\n".join(f"    {e}" for e in fs.outside_examples)
    verb = "were refused" if fs.outside == "refuse" else "reached the real file system"
    where, passthrough = (
        ("self.fs.path('name'), or pass self.fs.root", "set the class attribute outside = "
         "'passthrough' and suppress_health_check = [faultfs.HealthCheck.outside_root]")
        if machine
        else ("fs.path('name'), or pass fs.root", "pass outside='passthrough'")
    )  # fmt: skip
    also = (
        f"If it must also read or write real files, {passthrough}."
        if fs.outside == "refuse"
        else "outside='passthrough' is set already: if that real I/O is meant, only the "
        "suppression below is left to do."
    )
    raise fail(
        HealthCheck.outside_root,
        f"{who} made {fs.outside_calls} call(s) on paths outside the root {fs.root!r}; they "
        f"{verb}, so that I/O was never crash-tested:\n{examples}",
        f"Build every path the code under test uses from the root ({where} to the code as "
        f"its directory; a library's temporary files too: tempfile's default directory "
        f"is outside the root). {also}",
    )


def check_boundaries(fs: FaultFS, who: str, off: frozenset[HealthCheck]) -> None:
    if HealthCheck.no_boundaries in off or fs.boundaries:
        return
    raise fail(
        HealthCheck.no_boundaries,
        f"{who} passed no boundary under the root {fs.root!r}: it created, wrote, synced, "
        "renamed or removed nothing there, so there was no crash point and nothing was tested.",
        "Point the code under test at the root: build its paths with fs.path('name') or pass it "
        "fs.root as its data directory (relative paths and other directories are not the root). "
        "If it already uses the root, it writes there around Python's os and io (a C extension "
        "such as LMDB, HDF5 or gdbm, or another process), which faultfs cannot see: where the "
        "root is a real directory, the check of what appeared there names the files "
        "(docs/faultfs.md, 'Limits: what faultfs cannot see').",
    )


def check_acknowledged(acks: int, who: str, how: str, off: frozenset[HealthCheck]) -> None:
    if HealthCheck.nothing_acknowledged in off or acks:
        return
    raise fail(
        HealthCheck.nothing_acknowledged,
        f"{who} acknowledged nothing, so no crash could lose an acknowledged operation: "
        "a store that never makes anything durable passes such a test.",
        f"{how} If the test only checks that the store opens after any crash (nothing it "
        "returned has to survive), suppress this check.",
    )


def _shape(trace: Sequence[Op]) -> list[tuple[str, str]]:
    # Kinds and call sites, not paths or sizes: temporary names and timestamps may differ
    # between runs without moving any crash point.
    return [(op.kind, op.site) for op in trace]


def check_deterministic(first: FaultFS, second: FaultFS, off: frozenset[HealthCheck]) -> None:
    if HealthCheck.nondeterministic in off:
        return
    a, b = _shape(first.trace), _shape(second.trace)
    if first.boundaries == second.boundaries and a == b:
        return
    index = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )

    def show(trace: Sequence[Op]) -> str:
        return str(trace[index]) if index < len(trace) else "(nothing: the run had ended)"

    raise fail(
        HealthCheck.nondeterministic,
        f"the workload is not deterministic: two runs from the same start passed "
        f"{first.boundaries} and {second.boundaries} boundaries; operation #{index + 1} was\n"
        f"    {show(first.trace)}\n  then\n    {show(second.trace)}",
        "explore counts the boundaries in one run and takes the crash states of every one "
        "from another, so every run must do the same I/O: seed random choices, reset "
        "module-level state (caches, counters) on entry, and keep wall-clock time out of "
        "control flow.",
    )


def unreached(boundary: int, fs: FaultFS, off: frozenset[HealthCheck]) -> FailedHealthCheck | None:
    if HealthCheck.nondeterministic in off:
        return None
    return NondeterministicWorkload(
        f"faultfs health check nondeterministic failed: the workload passed {fs.boundaries} "
        f"boundaries this time and never reached boundary {boundary}; make it deterministic "
        "(seeded randomness, fresh state per run).\nIf this is what you meant, suppress it: "
        "suppress_health_check=[faultfs.HealthCheck.nondeterministic] (unreached boundaries "
        "are then skipped).",
    )


def check_images_looked_at(images: int, touched: int, off: frozenset[HealthCheck]) -> None:
    if HealthCheck.check_never_ran in off or (images and touched):
        return
    problem = (
        "no crash image was checked"
        if not images
        else f"recover_and_check made no call under the root on any of the {images} crash "
        "images it was given, so it checked nothing"
    )
    raise fail(
        HealthCheck.check_never_ran,
        problem,
        "recover_and_check(img) must run recovery on the crashed files and read them back: "
        "open img.path('name'), list img.root, or use img.tree() / img.read_file('name'). "
        "A check that reads a real directory, a copy made before the crash, or nothing at all "
        "passes whatever the crash did.",
    )


def check_start(error: str, where: str, off: frozenset[HealthCheck]) -> None:
    """The check failed on the starting state: no crash can explain that, so stop before sweeping.

    Left to the sweep, a check that fails everywhere (a typo in it, a file it expects
    that setup never made) fails every image, and cause analysis blames the code
    under test for it: missing fsyncs in a library that has them all.
    """
    if HealthCheck.check_fails_at_start in off:
        return
    raise fail(
        HealthCheck.check_fails_at_start,
        f"recover_and_check fails on the starting state, before the workload ran (the files "
        f"setup made, all durable; nothing acknowledged): {error}{where}",
        "No crash can have caused that, so the sweep would blame the code under test for the "
        "check's own failure. Fix the check (or the setup): with nothing acknowledged it must "
        "accept what setup left (and, without setup, an empty root).",
    )
