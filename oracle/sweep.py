"""The exhaustive sweep: named scenarios crashed at every boundary, in every mode.

For a scenario (a fixed list of workload steps) the sweep first counts its
I/O boundaries, then for each boundary re-runs the scenario on a fresh disk
with a crash armed there, and checks every crash image of that point (bounded
per mode) by recovering a fresh orchestrator on it and comparing it with the
model. Optionally it also crashes recovery itself at each of its boundaries,
on the power image. Everything is deterministic: ids and clocks are counters.

Run it with ``python -m oracle.sweep`` (a table of states checked per
scenario) or through ``tests/stress/test_sweep.py``.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faultfs import MODES, FaultFS, SimulatedCrash
from oracle.errors import OracleViolation
from oracle.harness import CrashHarness, scripted_registry
from oracle.model import Model
from oracle.workload import Step
from substrat.checkpointer import CheckpointPolicy
from substrat.providers.registry import ProviderRegistry

DEFAULT_IMAGES_PER_MODE = 4
MAX_RECOVERY_BOUNDARIES = 48
RECOVERY_CRASH_EVERY = 3
"""Recovery itself is crashed at every boundary of every third crash point: the
recovery code is the same at each point, what differs is the disk it starts from."""


@dataclass(frozen=True)
class Scenario:
    name: str
    steps: tuple[Step, ...]
    slots: int = 2
    checkpoints: CheckpointPolicy | None = None
    """The checkpoint policy the scenario runs under (None: the orchestrator's default)."""


SMALL_CHECKPOINTS = CheckpointPolicy(every_entries=6, segment_bytes=1500, compaction="archive")
"""Thresholds small enough that a short scenario checkpoints often, seals segments and
archives them (see substrat.checkpointer)."""


DELETING_CHECKPOINTS = CheckpointPolicy(every_entries=4, segment_bytes=500, compaction="delete")
"""The same under the ``delete`` compaction policy, small enough that a short scenario
deletes an agent's first segments (its base written first: see substrat.logbase)."""


def _s(*parts: str) -> Step:
    return Step(*parts)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("roots", (_s("create_root", "ada"), _s("create_root", "bob"), _s("turn", "ada"))),
        Scenario(
            "children",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("spawn", "ada/bob", "cy"),
                _s("turn", "ada/bob/cy"),
            ),
        ),
        Scenario(
            "messages both ways",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("send", "ada", "bob"),
                _s("pending"),
                _s("complete", "ada/bob"),
                _s("inbox", "ada"),
                _s("send", "ada", "user"),
                _s("user_inbox"),
            ),
        ),
        Scenario(
            "stranded reply",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("ask", "ada", "bob"),
                _s("pending"),
            ),
        ),
        Scenario(
            "broadcast",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("spawn", "ada", "cy"),
                _s("broadcast", "ada/bob"),
                _s("pending"),
            ),
        ),
        Scenario(
            "evictions",
            (
                _s("create_root", "ada"),
                _s("turn", "ada"),
                _s("create_root", "bob"),
                _s("turn", "bob"),
                _s("turn", "ada"),
                _s("evict", "ada"),
                _s("turn", "ada"),
            ),
            slots=1,
        ),
        Scenario(
            "terminations",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("spawn", "ada/bob", "cy"),
                _s("send", "ada", "ada/bob/cy"),
                _s("terminate_by_parent", "ada", "bob"),
                _s("create_root", "dee"),
                _s("terminate", "dee"),
            ),
        ),
        Scenario(
            "checkpoints and compaction",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("ask", "ada", "ada/bob"),
                _s("pending"),
                _s("send", "ada/bob", "user"),
                _s("checkpoint"),
                _s("user_inbox"),
                _s("turn", "ada"),
                _s("evict", "ada"),
                _s("turn", "ada"),
            ),
            slots=1,
            checkpoints=SMALL_CHECKPOINTS,
        ),
        Scenario(
            "checkpoints and deletion",
            (
                _s("create_root", "ada"),
                _s("spawn", "ada", "bob"),
                _s("ask", "ada", "ada/bob"),
                _s("pending"),
                _s("turn", "ada"),
                _s("send", "ada/bob", "user"),
                _s("turn", "ada"),
                _s("checkpoint"),
                _s("evict", "ada"),
                _s("turn", "ada"),
            ),
            slots=1,
            checkpoints=DELETING_CHECKPOINTS,
        ),
    )
}


def share_of(boundaries: int, share: tuple[int, int]) -> range:
    """The boundaries (1-based) that share ``(k, n)`` of a sweep crashes at: the k-th of n
    consecutive blocks. The n shares of one sweep are disjoint and together are all of its
    boundaries (a block may be empty when there are fewer boundaries than shares).

    Blocks, not every n-th boundary: neighbouring boundaries often leave the same disk
    and model, which a sweep checks once (:func:`state_key`), so splitting them apart
    would check most states twice. A later boundary costs more (the scenario runs up to
    it, and there is more to recover), so the blocks are cut at equal cost, counting
    boundary ``b`` of ``B`` as ``B + 2 * b``: the later blocks are shorter.
    """
    index, count = share
    assert count >= 1 and 0 <= index < count, f"share {index} of {count} does not exist"

    def cost_to(b: int) -> int:  # the summed cost of boundaries 1..b
        return boundaries * b + b * (b + 1)

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
    model of one of these, so they share its verdict."""
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    _verdicts: dict[bytes, str | None] = field(default_factory=dict, repr=False)
    _recovery_sweeps: dict[bytes, tuple[int, list[str]]] = field(default_factory=dict, repr=False)

    @property
    def rate(self) -> float:
        return (self.states + self.recovery_states) / self.seconds if self.seconds else 0.0


def state_key(image: FaultFS, model: Model) -> bytes:
    """Equal for two crash states that must get the same verdict: the same disk and model.

    Recovery is deterministic given the disk (ids and clocks only name what it
    writes), and the checks read nothing but the recovered root and the model,
    so such states need one recovery between them. Unequal keys for equal
    states only cost a check.
    """
    inflight = None if model.inflight is None else (model.inflight.kind, model.inflight.args)
    return pickle.dumps((sorted(image.tree().items()), model.state, inflight))


def _check(
    harness: CrashHarness, image: FaultFS, label: str, result: SweepResult, dedupe: bool
) -> None:
    key = state_key(image, harness.model) if dedupe else b""
    if dedupe and key in result._verdicts:
        failure = result._verdicts[key]
        if failure is not None:
            result.failures.append(f"{label} (same disk and model as an earlier failure)")
        return
    failure = None
    try:
        harness.check_image(image, harness.model.copy())
    except OracleViolation as exc:
        failure = str(exc)
        result.failures.append(f"{label}\n{exc}")
    result.distinct += 1
    if dedupe:
        result._verdicts[key] = failure


def count_boundaries(scenario: Scenario, profile: str, **harness_options: Any) -> int:
    harness = CrashHarness(
        profile=profile, slots=scenario.slots, checkpoints=scenario.checkpoints, **harness_options
    )
    start = harness.fs.boundaries
    harness.run_steps(list(scenario.steps))
    harness.close()
    return harness.fs.boundaries - start


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
    """
    options: dict[str, Any] = {"registry": registry, "provider": provider}
    result = SweepResult(scenario.name, profile)
    started = time.perf_counter()
    result.boundaries = count_boundaries(scenario, profile, **options)
    for boundary in share_of(result.boundaries, share):
        result.swept.append(boundary)
        harness = CrashHarness(
            profile=profile, slots=scenario.slots, checkpoints=scenario.checkpoints, **options
        )
        crashed_in = harness.run_steps(list(scenario.steps), crash_at=boundary)
        assert crashed_in is not None, f"boundary {boundary} of {result.boundaries} never hit"
        harness.model.crashed()
        for mode in modes:
            for index, image in enumerate(harness.fs.crash_images(mode, limit=images_per_mode)):
                step = scenario.steps[crashed_in]
                key = f"boundary={boundary} mode={mode} image=#{index} in step {step}"
                _check(harness, image, key, result, dedupe)
                result.states += 1
        if recovery_crashes and boundary % RECOVERY_CRASH_EVERY == 0:
            _sweep_recovery(harness, boundary, result, dedupe)
        harness.close()
        if len(result.failures) >= max_failures:
            break
    result.seconds = time.perf_counter() - started
    return result


def _sweep_recovery(
    harness: CrashHarness, boundary: int, result: SweepResult, dedupe: bool = True
) -> None:
    """Crash recovery itself at each of its boundaries (power image), then recover again.

    Recovery's crash points depend only on the disk it starts from, so a
    power image (and model) already swept this way takes the earlier outcome.
    """
    power = harness.fs.crash_image("power")
    key = state_key(power, harness.model) if dedupe else b""
    if dedupe and key in result._recovery_sweeps:
        states, failures = result._recovery_sweeps[key]
        result.recovery_states += states
        result.failures.extend(
            f"boundary={boundary}: as an earlier boundary: {f}" for f in failures
        )
        return
    states_before, failures_before = result.recovery_states, len(result.failures)
    _sweep_recovery_from(harness, power, boundary, result, dedupe)
    if dedupe:
        result._recovery_sweeps[key] = (
            result.recovery_states - states_before,
            result.failures[failures_before:],
        )


def _sweep_recovery_from(
    harness: CrashHarness, power: FaultFS, boundary: int, result: SweepResult, dedupe: bool
) -> None:
    for recovery_boundary in range(1, MAX_RECOVERY_BOUNDARIES + 1):
        image = power.crash_image("process")  # a fresh copy of the same disk
        image.arm(recovery_boundary)
        try:
            harness.check_image(image, harness.model.copy())
        except SimulatedCrash:
            pass
        except OracleViolation as exc:
            result.failures.append(f"boundary={boundary} (recovery ran unarmed)\n{exc}")
            return
        else:
            return  # recovery has fewer boundaries than this: all of them were tried
        for mode in ("process", "power"):
            second = image.crash_image(mode)
            key = f"boundary={boundary} recovery-crash={recovery_boundary} then mode={mode}"
            _check(harness, second, key, result, dedupe)
            result.recovery_states += 1


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
        help="crash only at every N-th boundary from boundary K+1 (share K of N)",
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
