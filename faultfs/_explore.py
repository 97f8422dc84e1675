"""explore(): every boundary of a workload times every crash image, checked by the caller.

The workload runs once to count its boundaries, then once per boundary with
the counter armed there. Each crash point's images (per mode) are handed to
``recover_and_check`` inside an active FaultFS; any exception it raises is a
failure. Failures are grouped by the call site of the operation at the crash
(the first line outside faultfs and the standard library), as ALICE groups
its findings.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from faultfs._fs import DEFAULT_BLOCK_SIZE, FaultFS, Snapshot
from faultfs._images import MODES, fingerprint
from faultfs._trace import Op
from faultfs.errors import ConfigError, ExploreFailed, NondeterministicWorkload, SimulatedCrash

DEFAULT_ROOT = "/faultfs-explore"
DEFAULT_IMAGES_PER_MODE = 16
# How many trace lines a report prints per failure group.
REPORT_TRACE_LINES = 12

Workload = Callable[[FaultFS], Any]
# The crash point after the workload returned (no boundary is armed for it).
END = -1
END_SITE = "<after the workload returned>"
END_OP = Op("end", "", (), END_SITE)


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
    trace: tuple[Op, ...]
    acked: tuple[Any, ...]

    @property
    def site(self) -> str:
        return self.op.site

    @property
    def key(self) -> str:
        """Reproduction key: ``report.replay(failure, workload)`` rebuilds the image."""
        where = "end" if self.boundary == END else str(self.boundary)
        return f"boundary={where} mode={self.mode} image=#{self.image_index} seed={self.seed}"


@dataclass
class ExploreReport:
    profile: str
    modes: tuple[str, ...]
    boundaries: int = 0
    images_checked: int = 0
    images_reused: int = 0
    failures: list[Failure] = field(default_factory=list)
    base: Snapshot | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return not self.failures

    def groups(self) -> dict[str, list[Failure]]:
        """Failures by call site, in order of first appearance."""
        out: dict[str, list[Failure]] = {}
        for failure in self.failures:
            out.setdefault(failure.site, []).append(failure)
        return out

    def modes_failed(self) -> set[str]:
        return {f.mode for f in self.failures}

    def assert_ok(self) -> None:
        if self.failures:
            raise ExploreFailed(str(self))

    def replay(self, failure: Failure, workload: Workload) -> FaultFS:
        """Re-run ``workload`` to ``failure``'s crash point and return its failing image."""
        assert self.base is not None, "report has no base snapshot"
        fs = FaultFS.from_snapshot(self.base)
        if failure.boundary == END:
            with fs:
                workload(fs)
        else:
            _run_armed(fs, workload, failure.boundary)
        return fs.crash_image(failure.mode, seed=failure.seed, index=failure.image_index)

    def __str__(self) -> str:
        groups = self.groups()
        lines = [
            f"faultfs explore: profile={self.profile} modes={','.join(self.modes)}",
            f"  {self.boundaries} boundaries, {self.images_checked} images checked "
            f"({self.images_reused} identical images reused), {len(self.failures)} failures "
            f"at {len(groups)} call sites",
        ]
        for number, (site, failures) in enumerate(groups.items(), start=1):
            by_mode: dict[str, int] = {}
            for f in failures:
                by_mode[f.mode] = by_mode.get(f.mode, 0) + 1
            modes = ", ".join(f"{m} x{n}" for m, n in by_mode.items())
            first = failures[0]
            lines += [
                "",
                f"[{number}] {site}  ({len(failures)} failures: {modes})",
                f"    first: {first.key}, crash {first.phase} {first.op.kind} {first.op.path}",
                f"    image: {first.detail}",
                f"    error: {first.error}",
                "    operations before the crash:",
            ]
            shown = first.trace[-REPORT_TRACE_LINES:]
            skipped = len(first.trace) - len(shown)
            if skipped:
                lines.append(f"      ... {skipped} earlier operations")
            lines += [f"      {skipped + i + 1:4d} {op}" for i, op in enumerate(shown)]
        return "\n".join(lines)


def _run_armed(fs: FaultFS, workload: Workload, boundary: int) -> None:
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


def explore(
    workload: Workload,
    recover_and_check: Callable[[FaultFS], Any],
    *,
    modes: Iterable[str] = MODES,
    profile: str = "posix",
    root: str = DEFAULT_ROOT,
    setup: Workload | None = None,
    images_per_mode: int = DEFAULT_IMAGES_PER_MODE,
    seed: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    dedupe: bool = True,
    boundaries: Sequence[int] | None = None,
) -> ExploreReport:
    """Crash ``workload`` at every boundary, in every mode, and check each image.

    ``workload(fs)`` runs inside an active FaultFS (paths under ``fs.root``);
    it may call ``fs.ack(x)`` when it acknowledges ``x``. ``recover_and_check(img)``
    runs inside the active crash image (``img.acked`` holds what was acknowledged
    before the crash, ``img.origin`` where it crashed) and raises on a violation.
    ``setup(fs)``, if given, builds the starting state once; it is then made
    fully durable. With ``dedupe``, an image whose tree and acknowledgements
    equal an already checked one reuses that result: the check must depend on
    nothing else. ``boundaries`` restricts the sweep to the given boundaries.
    """
    modes = tuple(modes)
    for mode in modes:
        if mode not in MODES:
            raise ConfigError(f"unknown crash mode {mode!r}; choose from {MODES}")
    base = FaultFS(root, profile, block_size=block_size)
    if setup is not None:
        with base:
            setup(base)
        base.sync_all()
        base.acked.clear()
    snap = base.snapshot()
    counting = FaultFS.from_snapshot(snap)
    with counting:
        workload(counting)
    report = ExploreReport(profile, modes, counting.boundaries, base=snap)
    results: dict[tuple[object, ...], tuple[str, str] | None] = {}
    points = list(range(1, counting.boundaries + 1)) if boundaries is None else list(boundaries)
    # The last crash point is after the workload returned: what it acknowledged
    # last must survive too, and no boundary follows those final acks.
    points.append(END)
    for boundary in points:
        if boundary == END:
            fs, phase = counting, "end"
            op = fs.trace[-1]._replace(site=END_SITE) if fs.trace else END_OP
        else:
            fs = FaultFS.from_snapshot(snap)
            _run_armed(fs, workload, boundary)
            assert fs.crash_point is not None
            _, phase, op = fs.crash_point
        for mode in modes:
            for image in fs.crash_images(mode, limit=images_per_mode, seed=seed):
                key = (fingerprint(image.model), repr(image.acked)) if dedupe else None
                if key is not None and key in results:
                    outcome = results[key]
                    report.images_reused += 1
                else:
                    outcome = _check(image, recover_and_check)
                    report.images_checked += 1
                    if key is not None:
                        results[key] = outcome
                if outcome is not None:
                    origin = image.origin
                    assert origin is not None and origin.index is not None
                    report.failures.append(
                        Failure(
                            boundary=boundary,
                            phase=phase,
                            op=op,
                            mode=mode,
                            image_index=origin.index,
                            seed=seed,
                            detail=origin.detail,
                            error=outcome[0],
                            traceback=outcome[1],
                            trace=tuple(fs.trace),
                            acked=tuple(fs.acked),
                        )
                    )
    return report


def _check(image: FaultFS, recover_and_check: Callable[[FaultFS], Any]) -> tuple[str, str] | None:
    try:
        with image:
            recover_and_check(image)
    except Exception as exc:  # any exception from the check is the finding
        return f"{type(exc).__name__}: {exc}", traceback.format_exc()
    return None
