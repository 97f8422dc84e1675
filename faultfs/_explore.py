"""explore(): every boundary of a workload times every crash image, checked by the caller.

The workload runs once to count its boundaries (and once more to check that
it is deterministic), then once more capturing, at every boundary, the crash
state an armed crash there would leave (``FaultFS.capture_at``): a run per
``CAPTURED_PER_RUN`` boundaries instead of a run per boundary. With the
nondeterministic health check suppressed, each boundary gets its own run armed
there, as before capture existed: a workload allowed to differ between runs is
sampled anew per crash point. Each crash point's images (per mode) are handed to
``recover_and_check`` inside an active FaultFS; any exception it raises is a
failure. Each failing image is then traced back to its cause (see
``_causes``): the unsynced operation whose loss broke the check, and what
made the program rely on it.
"""

from __future__ import annotations

import os
import pickle
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from faultfs import _health, _realdisk
from faultfs._arguments import checked
from faultfs._causes import CrashPoint, Finding, Outcome
from faultfs._escapes import diagnose
from faultfs._fs import DEFAULT_BLOCK_SIZE, FaultFS, Snapshot
from faultfs._handoff import named_inside
from faultfs._health import HealthCheck
from faultfs._images import MODES, fingerprint
from faultfs._model import Model
from faultfs._profiles import get_profile
from faultfs._report import END, END_SITE, ExploreReport, Failure, Workload
from faultfs._trace import Frame, Op, is_user_file
from faultfs._wording import exception_words
from faultfs.errors import ConfigError, CrashSwallowed, EscapeError, SimulatedCrash

DEFAULT_ROOT = "/faultfs-explore"
DEFAULT_IMAGES_PER_MODE = 16
# Crash states kept from one capturing run: each holds a copy of the model's
# inodes and of the trace so far, so a long workload is captured in slices.
CAPTURED_PER_RUN = 256
END_OP = Op("end", "", (), END_SITE)
# Findings that blame the state the code leaves between two operations, with every write
# on the disk: a check that refuses an operation in flight yields them too.
STATE_ITSELF = frozenset(("not-atomic", "in-place-rewrite"))

Check = Callable[[FaultFS], Any]


@checked
def explore(
    workload: Workload,
    recover_and_check: Check,
    *,
    modes: str | Iterable[str] = MODES,
    profile: str | Sequence[str] = "posix",
    root: str = DEFAULT_ROOT,
    setup: Workload | None = None,
    images_per_mode: int = DEFAULT_IMAGES_PER_MODE,
    seed: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    dedupe: bool = True,
    boundaries: Sequence[int] | None = None,
    causes: bool = True,
    outside: str = "refuse",
    suppress_health_check: Iterable[HealthCheck | str] = (),
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

    ``outside="refuse"`` (the default) makes a call on a path outside the root
    raise OutsideRootError; ``"passthrough"`` lets it reach the real system.
    Either way such calls fail the ``outside_root`` health check. The health
    checks (:class:`HealthCheck`) raise FailedHealthCheck when the run would
    pass without testing anything; ``suppress_health_check`` turns named ones
    off. A call that reached the real file system around the interceptors
    raises EscapeError.
    """
    modes = (modes,) if isinstance(modes, str) else tuple(modes)  # "power" is one mode
    for mode in modes:
        if mode not in MODES:
            raise ConfigError(f"unknown crash mode {mode!r}; choose from {MODES}")
    profiles = (profile,) if isinstance(profile, str) else tuple(profile)
    if not profiles:
        raise ConfigError("profile needs at least one profile name")
    for name in profiles:
        get_profile(name)
    off = _health.suppressed(suppress_health_check)
    report = ExploreReport(profiles, modes)
    # A C extension or a child process writing the real directory under a real root is
    # I/O nothing crashed: the run's verdict says nothing about it.
    with _realdisk.unchanged(os.path.normpath(os.fspath(root))):
        for name in profiles:
            _explore_profile(
                report, workload, recover_and_check, name, root, setup, images_per_mode, seed,
                block_size, dedupe, boundaries, causes, outside, off,
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
    outside: str,
    off: frozenset[HealthCheck],
) -> None:
    base = FaultFS(root, profile, outside, block_size=block_size)
    base.watch_outside = True
    base._preopened = _realdisk.preopened(base.root)  # one scan for every run of the sweep
    report.root = base.root
    if setup is not None:
        _run(base, setup)
        _health.check_outside(base, "setup", off)
        base.sync_all()
        base.acked.clear()
    snap = base.snapshot()
    report.bases[profile] = snap
    counting = _fresh(snap, base)
    _run(counting, workload)
    _health.check_outside(counting, "the workload", off)
    _health.check_boundaries(counting, "the workload", off)
    _health.check_acknowledged(
        len(counting.acked),
        "the workload",
        "Call fs.ack(x) in the workload each time the code under test acknowledges x (a "
        "save, put or commit returned), and have recover_and_check(img) require what "
        "img.acked lists.",
        off,
    )
    if HealthCheck.nondeterministic not in off:
        again = _fresh(snap, base)
        _run(again, workload)
        _health.check_deterministic(counting, again, off)
    if HealthCheck.check_fails_at_start not in off:
        start = _check(_fresh(snap, base), recover_and_check, off)
        if start is not None:
            at = f" (at {start.frame.display(os.getcwd())})" if start.frame is not None else ""
            _health.check_start(start.error, at, off)
    report.boundaries = max(report.boundaries, counting.boundaries)
    results: dict[tuple[object, ...], Outcome | None] = {}
    checked = looked_at = 0

    def check(image: FaultFS, analysing: bool = False) -> Outcome | None:
        nonlocal checked, looked_at
        key = (fingerprint(image.model), repr(image.acked)) if dedupe else None
        if key is not None and key in results:
            if not analysing:
                report.images_reused += 1
            return results[key]
        outcome = _check(image, recover_and_check, off)
        if analysing:
            report.images_analysed += 1
        else:
            report.images_checked += 1
            checked += 1
            looked_at += image.touches > 0
        if key is not None:
            results[key] = outcome
        return outcome

    points = list(range(1, counting.boundaries + 1)) if boundaries is None else list(boundaries)
    # The last crash point is after the workload returned: what it acknowledged
    # last must survive too, and no boundary follows those final acks.
    points.append(END)
    rerun = HealthCheck.nondeterministic in off
    captured: dict[int, FaultFS] = {}
    # Crash points whose every image passed, by their model and acknowledgements: a later
    # point equal in both has the same images, each a reuse (see Model.key), not built.
    passed: dict[bytes, int] = {}
    for boundary in points:
        if boundary == END:
            fs, phase = counting, "end"
            op = fs.trace[-1]._replace(site=END_SITE) if fs.trace else END_OP
        else:
            if rerun:
                fs = _fresh(snap, base)
                if not _run_armed(fs, workload, boundary, off):
                    report.unreached.append(boundary)
                    continue
            else:
                if boundary not in captured:
                    captured = _capture_run(snap, workload, counting, points, boundary, off)
                fs = captured[boundary]
            assert fs.crash_point is not None
            _, phase, op = fs.crash_point
        point = pickle.dumps((fs.model.key(), repr(fs.acked))) if dedupe else b""
        if point in passed:
            report.images_reused += passed[point]
            continue
        analysis = _crash_point(fs, check) if causes else None
        full_state_landed = _full_state_landed(fs, counting.acked, seed, images_per_mode, check)
        images, failed = 0, len(report.failures)
        for mode in report.modes:
            for image in fs.crash_images(mode, limit=images_per_mode, seed=seed):
                images += 1
                outcome = check(image)
                if outcome is None:
                    continue
                origin = image.origin
                assert origin is not None and origin.index is not None
                landed = (
                    _in_flight_landed(fs, image, counting.acked, seed, images_per_mode, check)
                    if causes
                    else None
                )
                if landed is not None:
                    # Nothing acknowledged was lost: the cause analysis would blame the code.
                    outcome = outcome._replace(error=landed + outcome.error)
                    findings: tuple[Finding, ...] = ()
                elif analysis is not None:
                    findings = tuple(analysis.analyze(origin.choice, outcome))
                    if any(f.kind in STATE_ITSELF for f in findings) and full_state_landed():
                        # "Rejected even with every write on the disk": with every write,
                        # the operation in flight landed, and the check refuses only that.
                        findings = tuple(f for f in findings if f.kind not in STATE_ITSELF)
                else:
                    findings = ()
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
        if point and len(report.failures) == failed:
            passed[point] = images
    _health.check_images_looked_at(checked, looked_at, off)


def _in_flight_landed(
    fs: FaultFS,
    image: FaultFS,
    acks: Sequence[object],
    seed: int,
    limit: int,
    check: Callable[[FaultFS, bool], Outcome | None],
) -> str | None:
    """Why the check, not the code, is at fault for failing ``image``, if it is.

    The operation in flight at the crash (the one the workload acknowledged next)
    may have landed: if the image passes once that acknowledgement is counted, all
    it shows is that it landed, which a crash before the acknowledgement may leave.
    """
    done = len(image.acked)
    origin = image.origin
    if done >= len(acks) or origin is None:
        return None
    # A fresh copy of the image (the check ran recovery on this one): the same draw.
    again = next(
        (
            other
            for other in fs.crash_images(origin.mode, limit=limit, seed=seed)
            if other.origin is not None and other.origin.index == origin.index
        ),
        None,
    )
    if again is None:
        return None
    again.acked = [*again.acked, acks[done]]
    if check(again, True) is not None:
        return None
    return (
        f"the check rejects this image but accepts it with the operation in flight counted "
        f"(the workload's next fs.ack: {acks[done]!r}): that operation landed before it was "
        "acknowledged, which a crash may leave, so the check, not the code, is at fault: "
        'make it accept both (docs/faultfs.md, "Operations in flight"). The check raised: '
    )


def _full_state_landed(
    fs: FaultFS,
    acks: Sequence[object],
    seed: int,
    limit: int,
    check: Callable[[FaultFS, bool], Outcome | None],
) -> Callable[[], bool]:
    """Whether the crash point's full state (a kill -9's image) fails only because the
    operation in flight landed; asked at most once per crash point."""
    known: list[bool] = []

    def ask() -> bool:
        if not known:
            image = next(fs.crash_images("process", limit=limit, seed=seed))
            known.append(
                check(image, True) is not None
                and _in_flight_landed(fs, image, acks, seed, limit, check) is not None
            )
        return known[0]

    return ask


def _fresh(snap: Snapshot, like: FaultFS) -> FaultFS:
    fs = FaultFS.from_snapshot(snap)
    fs.watch_outside = True
    fs._preopened = like._preopened
    return fs


def _run(fs: FaultFS, workload: Workload) -> None:
    """Run ``workload`` inside ``fs``; an escape (even one it swallowed) stops explore."""
    try:
        with named_inside(fs):  # asked while the model can answer
            workload(fs)
    except (EscapeError, CrashSwallowed):
        raise
    except BaseException as exc:  # the crash, or the workload's own error
        escape = diagnose(exc, (fs.root,))
        if escape is not None:
            raise escape from exc
        _health.check_escapes(fs)  # an escape it swallowed explains more than what followed
        raise
    _health.check_escapes(fs)


def _run_armed(fs: FaultFS, workload: Workload, boundary: int, off: frozenset[HealthCheck]) -> bool:
    """Run ``workload`` crashing at ``boundary``; False if it never got there (when allowed)."""
    fs.arm(boundary)
    try:
        _run(fs, workload)
    except SimulatedCrash:
        pass
    if fs.crashed:
        return True
    error = _health.unreached(boundary, fs, off)
    if error is not None:
        raise error
    return False


def _capture_run(
    snap: Snapshot,
    workload: Workload,
    counting: FaultFS,
    points: Sequence[int],
    first: int,
    off: frozenset[HealthCheck],
) -> dict[int, FaultFS]:
    """One run capturing the crash states of ``first`` and the next planned points.

    Equal to arming each of them in its own run when the workload is
    deterministic, which this run must show: it reaches every boundary it
    captures and passes the same operations as the counting run.
    """
    wanted = sorted({b for b in points if b != END and b >= first})[:CAPTURED_PER_RUN]
    fs = _fresh(snap, counting)
    copies = fs.capture_at(wanted)
    _run(fs, workload)
    found = {copy.boundaries: copy for copy in copies}
    for boundary in wanted:
        if boundary not in found:
            error = _health.unreached(boundary, fs, off)
            assert error is not None, "capturing runs only with the nondeterministic check on"
            raise error
    _health.check_deterministic(counting, fs, off)
    return found


def _crash_point(fs: FaultFS, check: Callable[[FaultFS, bool], Outcome | None]) -> CrashPoint:
    def verdict(model: Model) -> Outcome | None:
        return check(fs._spawn(model, "analysis", None, 0, "cause analysis"), True)

    return CrashPoint(fs.model, fs.trace, fs.op_inodes, fs.ack_marks, verdict, fs.ack_buffered)


def _check(image: FaultFS, recover_and_check: Check, off: frozenset[HealthCheck]) -> Outcome | None:
    error: Exception | None = None
    escape = None
    with image:
        try:
            recover_and_check(image)
        except Exception as exc:  # any exception from the check is the finding
            error = exc
            escape = diagnose(exc, (image.root,))
            # Its objects are finalized now, inside the image, not on the real disk later.
            traceback.clear_frames(exc.__traceback__)
    if escape is not None:
        raise escape from error
    _health.check_escapes(image)
    _health.check_outside(image, "recover_and_check", off)
    if error is None:
        return None
    return Outcome(
        exception_words(error),
        "".join(traceback.format_exception(error)),
        _raising_frame(error),
    )


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
