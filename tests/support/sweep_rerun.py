"""The sweep's crash states the old way: the scenario re-run up to each boundary with a
crash armed there, recovery re-run up to each of its boundaries. What oracle.sweep
captures in one run must equal this, state for state (tests/stress/test_sweep_capture.py,
tests/integration/test_sweep_capture_smoke.py)."""

from __future__ import annotations

import pickle
from typing import Any

from faultfs import FaultFS, SimulatedCrash
from oracle.harness import CrashHarness
from oracle.model import Model
from oracle.sweep import (
    MAX_RECOVERY_BOUNDARIES,
    RECOVERY_CRASH_EVERY,
    Scenario,
    count_boundaries,
    quiet_runtime,
    share_of,
    sweep,
)

State = tuple[str, bytes]


def fingerprint(label: str, image: FaultFS, model: Model, counters: tuple[int, int]) -> State:
    """A crash state as the checks would meet it: the label, where the image comes from
    (boundary, phase, operation, mode, index), its files, its acknowledgements, the
    whole model (state, history with statuses, in-flight operation) and the ids and
    clock the check starts from."""
    origin = image.origin
    assert origin is not None
    op = None if origin.op is None else (origin.op.kind, origin.op.path, origin.op.args)
    where = (origin.boundary, origin.phase, op, origin.mode, origin.index, origin.detail)
    inflight = None if model.inflight is None else model.inflight.describe()
    whole = (model.state, [o.describe() for o in model.trace], inflight, model.acked_ops)
    body = (where, sorted(image.tree().items()), image.acked, whole, counters)
    return label, pickle.dumps(body)


@quiet_runtime()  # as the sweep: each of its many activations a push and a pop
def rerun_states(
    scenario: Scenario,
    *,
    profile: str,
    share: tuple[int, int],
    modes: tuple[str, ...],
    images_per_mode: int,
    recovery_crashes: bool = True,
    **options: Any,
) -> list[State]:
    """Every state the sweep checks (no deduplication), found by re-running to each
    boundary. Each check and each recovery starts from the ids and clock the crashed
    process had (the sweep's rule: then they write the same bytes however run)."""
    states: list[State] = []
    total = count_boundaries(scenario, profile, **options)
    for boundary in share_of(total, share):
        harness = CrashHarness(
            profile=profile, slots=scenario.slots, checkpoints=scenario.checkpoints, **options
        )
        crashed_in = harness.run_steps(list(scenario.steps), crash_at=boundary)
        assert crashed_in is not None, f"boundary {boundary} never hit"
        harness.model.crashed()
        model, at_crash = harness.model, harness.counters
        step = scenario.steps[crashed_in]
        for mode in modes:
            for index, image in enumerate(harness.fs.crash_images(mode, limit=images_per_mode)):
                label = f"boundary={boundary} mode={mode} image=#{index} in step {step}"
                states.append(fingerprint(label, image, model, at_crash))
        if recovery_crashes and boundary % RECOVERY_CRASH_EVERY == 0:
            power = harness.fs.crash_image("power")
            for k in range(1, MAX_RECOVERY_BOUNDARIES + 1):
                image = power.crash_image("process")
                image.arm(k)
                harness.counters = at_crash
                try:
                    harness.recover(image)
                except SimulatedCrash:
                    pass
                else:
                    # Checked was the copy recovery ran on, as it was before (the same disk
                    # as a fresh copy).
                    label = f"boundary={boundary} (recovery ran unarmed)"
                    unarmed = power.crash_image("process")
                    states.append(fingerprint(label, unarmed, model, at_crash))
                    break
                after = harness.counters
                for mode in ("process", "power"):
                    label = f"boundary={boundary} recovery-crash={k} then mode={mode}"
                    states.append(fingerprint(label, image.crash_image(mode), model, after))
        harness.close()
    return states


def captured_states(scenario: Scenario, **sweep_options: Any) -> list[State]:
    """Every state oracle.sweep hands to its check (no deduplication), recorded;
    ``sweep_options`` are :func:`oracle.sweep.sweep`'s (those of :func:`rerun_states`)."""
    states: list[State] = []

    def record(harness: CrashHarness, image: FaultFS, model: Model, label: str) -> None:
        states.append(fingerprint(label, image, model, harness.counters))

    sweep(scenario, dedupe=False, check=record, **sweep_options)
    return states


def first_difference(old: list[State], new: list[State]) -> str | None:
    """None when equal, else where they part (the labels of both sides there)."""
    for n, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            return f"state {n}: re-run {a[0]!r} vs captured {b[0]!r} (labels equal: {a[0] == b[0]})"
    if len(old) != len(new):
        return f"re-run found {len(old)} states, capture {len(new)}"
    return None
