"""explore(): every boundary of a workload times every crash image, checked by the caller.

The workload runs once to count its boundaries, then once per boundary with
the counter armed there. Each crash point's images (per mode) are handed to
``recover_and_check`` inside an active FaultFS; any exception it raises is a
failure. Each failing image is then traced back to its cause (see
``_causes``): the unsynced operation whose loss broke the check, and what
made the program rely on it.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from faultfs._causes import CrashPoint, Outcome
from faultfs._fs import DEFAULT_BLOCK_SIZE, FaultFS
from faultfs._images import MODES, fingerprint
from faultfs._model import Model
from faultfs._profiles import get_profile
from faultfs._report import END, END_SITE, ExploreReport, Failure, Workload, run_armed
from faultfs._trace import Frame, Op, is_user_file
from faultfs.errors import ConfigError

DEFAULT_ROOT = "/faultfs-explore"
DEFAULT_IMAGES_PER_MODE = 16
END_OP = Op("end", "", (), END_SITE)

Check = Callable[[FaultFS], Any]


def explore(
    workload: Workload,
    recover_and_check: Check,
    *,
    modes: Iterable[str] = MODES,
    profile: str | Sequence[str] = "posix",
    root: str = DEFAULT_ROOT,
    setup: Workload | None = None,
    images_per_mode: int = DEFAULT_IMAGES_PER_MODE,
    seed: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    dedupe: bool = True,
    boundaries: Sequence[int] | None = None,
    causes: bool = True,
) -> ExploreReport:
    """Crash ``workload`` at every boundary, in every mode, and check each image.

    ``workload(fs)`` runs inside an active FaultFS (paths under ``fs.root``);
    it may call ``fs.ack(x)`` when it acknowledges ``x``. ``recover_and_check(img)``
    runs inside the active crash image (``img.acked`` holds what was acknowledged
    before the crash, ``img.origin`` where it crashed) and raises on a violation.
    ``setup(fs)``, if given, builds the starting state once; it is then made
    fully durable. ``profile`` is one profile name or several (each is explored
    and the report counts failures per profile). ``block_size`` (bytes) is the
    unit in which the torn mode lands a write on block-based profiles: at 4096
    a write inside one block is never torn into a partial prefix (see
    docs/faultfs.md, "Torn writes"). With ``dedupe``, an image whose tree and
    acknowledgements equal an already checked one reuses that result: the
    check must depend on nothing else. ``boundaries`` restricts the sweep to
    the given boundaries. With ``causes``, each failing image is traced back
    to the missing durability step behind it (``report.causes()``).
    """
    modes = tuple(modes)
    for mode in modes:
        if mode not in MODES:
            raise ConfigError(f"unknown crash mode {mode!r}; choose from {MODES}")
    profiles = (profile,) if isinstance(profile, str) else tuple(profile)
    if not profiles:
        raise ConfigError("profile needs at least one profile name")
    for name in profiles:
        get_profile(name)
    report = ExploreReport(profiles, modes)
    for name in profiles:
        _explore_profile(
            report, workload, recover_and_check, name, root, setup, images_per_mode, seed,
            block_size, dedupe, boundaries, causes,
        )  # fmt: skip
    return report


def _explore_profile(
    report: ExploreReport,
    workload: Workload,
    recover_and_check: Check,
    profile: str,
    root: str,
    setup: Workload | None,
    images_per_mode: int,
    seed: int,
    block_size: int,
    dedupe: bool,
    boundaries: Sequence[int] | None,
    causes: bool,
) -> None:
    base = FaultFS(root, profile, block_size=block_size)
    report.root = base.root
    if setup is not None:
        with base:
            setup(base)
        base.sync_all()
        base.acked.clear()
    snap = base.snapshot()
    report.bases[profile] = snap
    counting = FaultFS.from_snapshot(snap)
    with counting:
        workload(counting)
    report.boundaries = max(report.boundaries, counting.boundaries)
    results: dict[tuple[object, ...], Outcome | None] = {}

    def check(image: FaultFS, analysing: bool = False) -> Outcome | None:
        key = (fingerprint(image.model), repr(image.acked)) if dedupe else None
        if key is not None and key in results:
            if not analysing:
                report.images_reused += 1
            return results[key]
        outcome = _check(image, recover_and_check)
        if analysing:
            report.images_analysed += 1
        else:
            report.images_checked += 1
        if key is not None:
            results[key] = outcome
        return outcome

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
            run_armed(fs, workload, boundary)
            assert fs.crash_point is not None
            _, phase, op = fs.crash_point
        analysis = _crash_point(fs, check) if causes else None
        for mode in report.modes:
            for image in fs.crash_images(mode, limit=images_per_mode, seed=seed):
                outcome = check(image)
                if outcome is None:
                    continue
                origin = image.origin
                assert origin is not None and origin.index is not None
                findings = (
                    tuple(analysis.analyze(origin.choice, outcome)) if analysis is not None else ()
                )
                report.failures.append(
                    Failure(
                        boundary=boundary,
                        phase=phase,
                        op=op,
                        mode=mode,
                        image_index=origin.index,
                        seed=seed,
                        detail=origin.detail,
                        error=outcome.error,
                        traceback=outcome.traceback,
                        trace=tuple(fs.trace),
                        acked=tuple(fs.acked),
                        profile=profile,
                        findings=findings,
                    )
                )


def _crash_point(fs: FaultFS, check: Callable[[FaultFS, bool], Outcome | None]) -> CrashPoint:
    def verdict(model: Model) -> Outcome | None:
        return check(fs._spawn(model, "analysis", None, 0, "cause analysis"), True)

    return CrashPoint(fs.model, fs.trace, fs.op_inodes, fs.ack_marks, verdict)


def _check(image: FaultFS, recover_and_check: Check) -> Outcome | None:
    try:
        with image:
            recover_and_check(image)
    except Exception as exc:  # any exception from the check is the finding
        return Outcome(f"{type(exc).__name__}: {exc}", traceback.format_exc(), _raising_frame(exc))
    return None


def _raising_frame(exc: BaseException) -> Frame | None:
    """The innermost frame of the user's code in ``exc``'s traceback."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_user_file(code.co_filename):
            found = Frame(code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return found
