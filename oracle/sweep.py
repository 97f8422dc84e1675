"""The exhaustive sweep: named scenarios crashed at every boundary, in every mode.

For a scenario (a fixed list of workload steps) the sweep first counts its
I/O boundaries, then runs it once more with faultfs capturing each boundary
of its share (:meth:`faultfs.FaultFS.capture_at`): at each, the crashed disk a
crash armed there would leave, the model with its in-flight operation marked
crashed, and the ids and clock of that moment. Only then, the run over, it
checks every crash image of each point (bounded per mode) by recovering a
fresh orchestrator on it and comparing it with the model (a check cannot run
inside the run: it needs the event loop the run is using). Optionally it also
crashes recovery itself at each of its boundaries, on the power image: one
recovery captured at each of its first MAX_RECOVERY_BOUNDARIES boundaries,
each crash then recovered again and checked. So a share costs a run of the
scenario up to its last boundary (and one to count them, once a process) and
one recovery per recovery sweep, not a run per boundary; a point whose disk and
model equal an earlier one's (:func:`point_key`) takes its images' verdicts.

Everything is deterministic: ids and clocks are counters, and every check and
recovery starts from those of the moment of its crash, so it writes the same
bytes as a re-run to that boundary would (tests/stress/test_sweep_capture.py
and tests/integration/test_sweep_capture_smoke.py show that the captured
states are exactly those that re-running finds).

Run it with ``python -m oracle.sweep`` (a table of states checked per
scenario) or through ``tests/stress/test_sweep.py``.
"""

from __future__ import annotations

import argparse
import gc
import pickle
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from faultfs import MODES, FaultFS, SimulatedCrash
from oracle.errors import OracleViolation
from oracle.harness import CrashHarness, held_interception, scripted_registry
from oracle.model import Model
from oracle.sweep_scenarios import DELETING_CHECKPOINTS as DELETING_CHECKPOINTS
from oracle.sweep_scenarios import SCENARIOS as SCENARIOS
from oracle.sweep_scenarios import SMALL_CHECKPOINTS as SMALL_CHECKPOINTS
from oracle.sweep_scenarios import SUMMARY_CHECKPOINTS as SUMMARY_CHECKPOINTS
from oracle.sweep_scenarios import Scenario as Scenario
from oracle.workload import Step
from substrat.providers.registry import ProviderRegistry

DEFAULT_IMAGES_PER_MODE = 4
MAX_RECOVERY_BOUNDARIES = 48
RECOVERY_CRASH_EVERY = 3
"""Recovery itself is crashed at every boundary of every third crash point: the
recovery code is the same at each point, what differs is the disk it starts from."""


def share_of(boundaries: int, share: tuple[int, int]) -> range:
    """The boundaries (1-based) that share ``(k, n)`` of a sweep crashes at: the k-th of n
    consecutive blocks. The n shares of one sweep are disjoint and together are all of its
    boundaries (a block may be empty when there are fewer boundaries than shares).

    Blocks, not every n-th boundary: neighbouring boundaries often leave the same disk
    and model, which a sweep checks once (:func:`state_key`), so splitting them apart
    would check most states twice. A later boundary costs more (there is more on the
    disk to recover and check: checkpoints and compaction's fourth fifth of boundaries
    cost 1.7x its first), so the blocks are cut at equal cost, counting boundary ``b``
    of ``B`` as ``B + b``: the later blocks are shorter. (Each share also runs the
    scenario twice, to count and to capture: a cost that does not depend on the block.)
    """
    index, count = share
    assert count >= 1 and 0 <= index < count, f"share {index} of {count} does not exist"

    def cost_to(b: int) -> float:  # the summed cost of boundaries 1..b
        return boundaries * b + b * (b + 1) / 2

    def cut(k: int) -> int:  # the last boundary of the first k blocks
        target = cost_to(boundaries) * k / count
        return next(b for b in range(boundaries + 1) if cost_to(b) >= target)

    return range(cut(index) + 1, cut(index + 1) + 1)


def shares(count: int) -> list[tuple[int, int]]:
    """All ``count`` shares of a sweep: run each once and the sweep is run whole."""
    return [(index, count) for index in range(count)]


@dataclass
class SweepResult:
    scenario: str
    profile: str
    boundaries: int = 0
    """All the scenario's boundaries (a share of the sweep crashes at some of them)."""
    swept: list[int] = field(default_factory=list)
    """The boundaries this sweep crashed at, in order."""
    states: int = 0
    recovery_states: int = 0
    distinct: int = 0
    """States actually recovered and checked; the others had the disk and the
    model of one of these (here or, with shared ``verdicts``, in another sweep), so
    they share its verdict."""
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    _verdicts: dict[bytes, str | None] = field(default_factory=dict, repr=False)
    _recovery_sweeps: dict[bytes, tuple[int, list[str]]] = field(default_factory=dict, repr=False)

    @property
    def rate(self) -> float:
        return (self.states + self.recovery_states) / self.seconds if self.seconds else 0.0


def model_key(model: Model) -> bytes:
    """The model's part of :func:`state_key`: equal for models with the same state and
    in-flight operation. The images of one crash point share their model, so the
    sweep computes it once per point (pickling the model was about a tenth of a sweep
    when it was done for every image)."""
    inflight = None if model.inflight is None else (model.inflight.kind, model.inflight.args)
    return pickle.dumps((model.state, inflight))


def state_key(image: FaultFS, model: Model, model_part: bytes | None = None) -> bytes:
    """Equal for two crash states that must get the same verdict: the same disk and model.

    Recovery is deterministic given the disk (ids and clocks only name what it
    writes), and the checks read nothing but the recovered root and the model,
    so such states need one recovery between them. The file-system profile is
    not part of the key: it decides which images a crash leaves, while a check
    recovers without a crash and reads only what is visible, which every profile
    shows alike. Unequal keys for equal states only cost a check. ``model_part``
    is ``model_key(model)`` when the caller already has it.
    """
    if model_part is None:
        model_part = model_key(model)
    return pickle.dumps((image.content_fingerprint(), model_part))


Check = Callable[[CrashHarness, FaultFS, Model, str], None]
"""What a crash state is handed to: ``check(harness, image, model, label)`` raises
OracleViolation when the state fails."""


def recover_and_check(harness: CrashHarness, image: FaultFS, model: Model, label: str) -> None:
    """The sweep's check: recover a fresh orchestrator on ``image``, compare with ``model``."""
    harness.check_image(image, model)


@dataclass
class CrashPoint:
    """What a crash at one boundary leaves, kept while the run went on (see :func:`capture`)."""

    fs: FaultFS
    """The crashed disk (:meth:`faultfs.FaultFS.capture_at`): its images are the crash's."""
    model: Model
    """The oracle's model at the crash, its in-flight operation marked crashed."""
    counters: tuple[int, int]
    """The harness's next id and clock tick at the crash: what the checks start from."""
    step: int = -1
    """The index of the step the crash interrupts (-1 inside recovery)."""


def capture(harness: CrashHarness, steps: Sequence[Step], boundaries: range) -> list[CrashPoint]:
    """Run ``steps`` until the last of ``boundaries`` (from now) is passed, keeping the
    crash point of each (the steps after it could add none: they are not run)."""
    points: list[CrashPoint] = []
    running = 0

    def keep(fs: FaultFS) -> None:
        model = harness.model.copy()
        model.crashed()
        points.append(CrashPoint(fs, model, harness.counters, running))

    harness.fs.capture_at(boundaries, keep)
    for running, step in enumerate(steps):  # noqa: B007 (keep reads it)
        if len(points) == len(boundaries):
            break
        assert harness.run_steps([step]) is None, "nothing is armed: no step crashes"
    harness.fs.capture_at(())
    assert len(points) == len(boundaries), f"{len(points)} of {len(boundaries)} boundaries hit"
    return points


def _check(
    harness: CrashHarness,
    image: FaultFS,
    model: Model,
    label: str,
    result: SweepResult,
    dedupe: bool,
    check: Check,
    model_part: bytes | None = None,
) -> bytes:
    """Check one state (or give it the verdict of its twin); its :func:`state_key`."""
    key = state_key(image, model, model_part) if dedupe else b""
    if dedupe and key in result._verdicts:
        failure = result._verdicts[key]
        if failure is not None:
            result.failures.append(f"{label} (same disk and model as an earlier failure)")
        return key
    failure = None
    try:
        check(harness, image, model.copy(), label)
    except OracleViolation as exc:
        failure = str(exc)
        result.failures.append(f"{label}\n{exc}")
    result.distinct += 1
    if dedupe:
        result._verdicts[key] = failure
    return key


def count_boundaries(scenario: Scenario, profile: str, **harness_options: Any) -> int:
    harness = CrashHarness(
        profile=profile, slots=scenario.slots, checkpoints=scenario.checkpoints, **harness_options
    )
    start = harness.fs.boundaries
    harness.run_steps(list(scenario.steps))
    harness.close()
    return harness.fs.boundaries - start


_COUNTS: dict[tuple[Scenario, str, Any, str], int] = {}


def _boundaries_of(scenario: Scenario, profile: str, registry: Any, provider: str) -> int:
    """:func:`count_boundaries` once a process (a run is deterministic): each share on each
    profile needs it (a run, 6% of a tests/stress/test_sweep.py item when counted for each)."""
    key = (scenario, profile, registry, provider)
    if key not in _COUNTS:
        _COUNTS[key] = count_boundaries(scenario, profile, registry=registry, provider=provider)
    return _COUNTS[key]


def point_key(fs: FaultFS) -> bytes:
    """Equal for crash points whose disk-and-cache models (faultfs's, which their images are
    built from) are equal in every field, the clock too: their images are the same in every
    mode. A crash after one call and one before the next are (half of a sweep's points)."""
    return pickle.dumps((fs.block_size, fs.model.key()))


@contextmanager
def quiet_runtime() -> Iterator[None]:
    """faultfs's interception held and the collector off while the block (or the
    decorated call) runs, as the crash fuzzer has them for an example (oracle.machines).

    A sweep activates a disk for every check, recovery and step. With nothing else
    active, each activation patched every intercepted function and each end collected
    garbage in full: in four items of tests/stress/test_sweep.py, 1,742 such collections
    and 161 of the collector's own. Held, an activation is a push and a pop, and what
    the checks and recoveries left is collected once, when the hold ends (a crashed run
    is still collected while its disk is active). The same states get the same checks:
    the collections freed objects nothing reads again (docs/benchmarks.md, session 28).
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        with held_interception():
            yield
    finally:
        if collecting:
            gc.enable()


@quiet_runtime()
def sweep(
    scenario: Scenario,
    *,
    profile: str = "posix",
    modes: tuple[str, ...] = MODES,
    images_per_mode: int = DEFAULT_IMAGES_PER_MODE,
    recovery_crashes: bool = True,
    max_failures: int = 5,
    registry: Callable[[], ProviderRegistry] = scripted_registry,
    provider: str = "scripted",
    dedupe: bool = True,
    share: tuple[int, int] = (0, 1),
    check: Check = recover_and_check,
    verdicts: dict[bytes, str | None] | None = None,
) -> SweepResult:
    """Crash ``scenario`` at every boundary and check every image (bounded per mode).

    ``registry`` and ``provider`` choose the provider the scenario's root
    agents (and so their children) run on. With ``dedupe`` a state with the
    disk and model of one already checked takes that one's verdict (see
    :func:`state_key`); ``result.distinct`` counts the recoveries run.
    ``share=(k, n)`` crashes only at the boundaries of :func:`share_of`, so one
    sweep can run as n independent pieces (pytest items on n workers); what a
    boundary checks does not depend on the share, only deduplication is per
    share (a state seen by another share is checked again, never skipped).
    ``check`` is what each state is handed to (:func:`recover_and_check`).
    ``verdicts`` (with ``dedupe``) is a memo of verdicts by :func:`state_key` to share
    with other sweeps of the same scenario, check and provider on other profiles:
    the same crash state under another profile takes the verdict it got there
    (recovery crashes are still swept on each profile, whose images they are).
    """
    options: dict[str, Any] = {"registry": registry, "provider": provider}
    result = SweepResult(scenario.name, profile)
    if verdicts is not None:
        result._verdicts = verdicts
    started = time.perf_counter()
    result.boundaries = _boundaries_of(scenario, profile, registry, provider)
    harness = CrashHarness(
        profile=profile, slots=scenario.slots, checkpoints=scenario.checkpoints, **options
    )
    swept = share_of(result.boundaries, share)
    points = capture(harness, scenario.steps, swept)
    seen: dict[bytes, list[tuple[str, int, bytes]]] = {}  # point -> its images' state keys
    for boundary, point in zip(swept, points, strict=True):
        result.swept.append(boundary)
        step = scenario.steps[point.step]
        model_part = model_key(point.model) if dedupe else None
        where = point_key(point.fs) + model_part if model_part is not None else b""
        if (done := seen.get(where)) is not None:  # an earlier point's images and model
            for mode, index, key in done:
                if result._verdicts[key] is not None:
                    label = f"boundary={boundary} mode={mode} image=#{index} in step {step}"
                    result.failures.append(f"{label} (same disk and model as an earlier failure)")
                result.states += 1
        else:
            done = []
            for mode in modes:
                for index, image in enumerate(point.fs.crash_images(mode, limit=images_per_mode)):
                    label = f"boundary={boundary} mode={mode} image=#{index} in step {step}"
                    harness.counters = point.counters
                    key = _check(
                        harness, image, point.model, label, result, dedupe, check, model_part
                    )
                    done.append((mode, index, key))
                    result.states += 1
            if where:
                seen[where] = done
        if recovery_crashes and boundary % RECOVERY_CRASH_EVERY == 0:
            _sweep_recovery(harness, point, boundary, result, dedupe, check)
        if len(result.failures) >= max_failures:
            break
    harness.close()
    result.seconds = time.perf_counter() - started
    return result


def _sweep_recovery(
    harness: CrashHarness,
    point: CrashPoint,
    boundary: int,
    result: SweepResult,
    dedupe: bool,
    check: Check,
) -> None:
    """Crash recovery itself at each of its boundaries (power image), then recover again.

    Recovery's crash points depend only on the disk it starts from, so a
    power image (and model) already swept this way takes the earlier outcome.
    """
    power = point.fs.crash_image("power")
    model_part = model_key(point.model) if dedupe else None
    key = state_key(power, point.model, model_part) if dedupe else b""
    if dedupe and key in result._recovery_sweeps:
        states, failures = result._recovery_sweeps[key]
        result.recovery_states += states
        result.failures.extend(
            f"boundary={boundary}: as an earlier boundary: {f}" for f in failures
        )
        return
    states_before, failures_before = result.recovery_states, len(result.failures)
    _sweep_recovery_from(harness, point, power, boundary, result, dedupe, check, model_part)
    if dedupe:
        result._recovery_sweeps[key] = (
            result.recovery_states - states_before,
            result.failures[failures_before:],
        )


def capture_recovery(harness: CrashHarness, point: CrashPoint, power: FaultFS) -> list[CrashPoint]:
    """Recover once on a copy of ``power``, keeping the crash point of each of recovery's
    first MAX_RECOVERY_BOUNDARIES boundaries (it stops at the last): fewer means recovery
    finished in fewer boundaries. Recovery starts from the ids and clock of ``point``."""
    points: list[CrashPoint] = []
    image = power.crash_image("process")  # a fresh copy of the same disk
    image.capture_at(
        range(1, MAX_RECOVERY_BOUNDARIES + 1),
        lambda fs: points.append(CrashPoint(fs, point.model, harness.counters)),
    )
    image.arm(MAX_RECOVERY_BOUNDARIES)
    harness.counters = point.counters
    try:
        harness.recover(image)
    except SimulatedCrash:
        pass
    return points


def _sweep_recovery_from(
    harness: CrashHarness,
    point: CrashPoint,
    power: FaultFS,
    boundary: int,
    result: SweepResult,
    dedupe: bool,
    check: Check,
    model_part: bytes | None = None,
) -> None:
    crashes = capture_recovery(harness, point, power)
    for recovery_boundary, crashed in enumerate(crashes, start=1):
        for mode in ("process", "power"):
            second = crashed.fs.crash_image(mode)
            key = f"boundary={boundary} recovery-crash={recovery_boundary} then mode={mode}"
            harness.counters = crashed.counters
            _check(harness, second, point.model, key, result, dedupe, check, model_part)
            result.recovery_states += 1
    if len(crashes) < MAX_RECOVERY_BOUNDARIES:
        # Recovery finished: the state it finished from (the power image, and the model)
        # is checked too, under its own label (with dedupe, the verdict of that very state
        # among the crash's images).
        harness.counters = point.counters
        label = f"boundary={boundary} (recovery ran unarmed)"
        image = power.crash_image("process")
        _check(harness, image, point.model, label, result, dedupe, check, model_part)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--profile", action="append", choices=("posix", "ext4-ordered", "lazyfs"))
    parser.add_argument("--images-per-mode", type=int, default=DEFAULT_IMAGES_PER_MODE)
    parser.add_argument("--no-recovery-crashes", action="store_true")
    parser.add_argument(
        "--share",
        nargs=2,
        type=int,
        default=(0, 1),
        metavar=("K", "N"),
        help="crash only at the (K+1)-th of N blocks of boundaries (share K of N, see share_of)",
    )
    args = parser.parse_args(argv)
    names = args.scenario or sorted(SCENARIOS)
    profiles = args.profile or ["posix", "ext4-ordered", "lazyfs"]
    total_states = 0
    total_seconds = 0.0
    failed = False
    print(
        f"{'scenario':<22}{'profile':<14}{'boundaries':>10}{'states':>9}{'rec.':>7}"
        f"{'distinct':>9}{'s':>8}{'/s':>9}"
    )
    for profile in profiles:
        for name in names:
            r = sweep(
                SCENARIOS[name],
                profile=profile,
                images_per_mode=args.images_per_mode,
                recovery_crashes=not args.no_recovery_crashes,
                share=(args.share[0], args.share[1]),
            )
            total_states += r.states + r.recovery_states
            total_seconds += r.seconds
            print(
                f"{r.scenario:<22}{r.profile:<14}{r.boundaries:>10}{r.states:>9}"
                f"{r.recovery_states:>7}{r.distinct:>9}{r.seconds:>8.2f}{r.rate:>9.0f}"
            )
            for failure in r.failures:
                failed = True
                print("  FAIL " + failure.replace("\n", "\n       "))
    print(
        f"total: {total_states} crash states in {total_seconds:.1f} s "
        f"({total_states / total_seconds if total_seconds else 0:.0f} states/s)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
