"""The sweep runs a scenario once and captures every crash point of its share
(faultfs's capture_at); it must check exactly the states that re-running the scenario
up to each boundary (and recovery up to each of its boundaries) finds. The wider
matrix is tests/stress/test_sweep_capture.py."""

from __future__ import annotations

from faultfs import MODES
from oracle.sweep import SCENARIOS
from tests.support.sweep_rerun import captured_states, first_difference, rerun_states


def test_one_run_captures_the_states_rerunning_finds() -> None:
    """A deleting checkpoint scenario on ext4-ordered, with recovery crashed too: labels,
    images (origin, files, acks), models and the ids and clock each check starts from.
    (Its log base was stamped with the wall clock, not the orchestrator's: re-runs
    wrote different bytes.)"""
    options = {"profile": "ext4-ordered", "share": (2, 5), "modes": MODES, "images_per_mode": 2}
    scenario = SCENARIOS["checkpoints and deletion"]
    old = rerun_states(scenario, **options)  # type: ignore[arg-type]
    new = captured_states(scenario, **options)  # type: ignore[arg-type]
    assert any("recovery-crash" in label for label, _ in old)
    assert any("unarmed" in label for label, _ in old)
    assert first_difference(old, new) is None, first_difference(old, new)
