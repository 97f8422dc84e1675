"""The crash fuzzer's counterexamples: its EIO and targeted-crash rules print as calls."""

from __future__ import annotations

import sys

import pytest

from oracle import machines
from oracle.machines import CrashPlan, CrashRecoveryMachine
from oracle.workload import Step
from tests.support.counterexamples import counterexample

RULES = {
    # the event a rule raises at its end (a planted failure) -> the call it is shown as
    "after EIO": "state.fail_fsyncs_and_crash(Step(",
    "EIO, going on": "state.fail_fsyncs_and_go_on(Step(",
    "targeted crash": "state.crash_during(Step(",
}


@pytest.mark.parametrize("planted", sorted(RULES))
def test_a_counterexample_shows_the_drawing_rules_as_calls(
    monkeypatch: pytest.MonkeyPatch, planted: str
) -> None:
    def fails_there(value: str) -> None:
        assert not value.startswith(planted), value  # a planted failure

    monkeypatch.setattr(machines, "event", fails_there)
    lines = counterexample(CrashRecoveryMachine)
    program = [line for line in lines if line.startswith("state")]
    assert program[0] == "state = CrashRecoveryMachine()", lines
    # the failing step is the call it made, with what it drew: replayable
    *before, last = program[-2].splitlines()  # (program[-1]: state.teardown())
    assert last.startswith(RULES[planted]), lines
    assert "data=data(" not in program[-2], lines
    assert all(line.startswith("state._step(Step(") for line in before), lines
    # no state.rule(data=data(...)) line for these rules, which a reader cannot replay
    hidden = (
        "fsync_failure_and_crash",
        "fsync_failure_where_it_matters",
        "send_then_crash",
        "crash_in_a_cascading",
    )
    assert not any(line.startswith(f"state.{name}") for line in lines for name in hidden), lines


@pytest.mark.parametrize(
    ("kind", "rule"),
    [("spawn", "spawn_child"), ("send", "send_message"), ("checkpoint", "checkpoint")],
)
def test_the_rules_that_pick_an_agent_print_as_calls(
    monkeypatch: pytest.MonkeyPatch, kind: str, rule: str
) -> None:
    """``spawn_child``, ``send_message``, ``checkpoint`` (and the other rules that pick an
    agent from ``st.data()``) show the step they ran, with its crash plan if any."""
    real = CrashRecoveryMachine._step

    def fails_there(self: CrashRecoveryMachine, step: Step, crash: CrashPlan | None = None) -> None:
        real(self, step, crash)
        caller = sys._getframe(1)  # _show_step (or the rule, on the old code)
        callers = {caller.f_code.co_name, caller.f_back.f_code.co_name if caller.f_back else ""}
        assert rule not in callers, step  # a planted failure, in the step that rule drew

    monkeypatch.setattr(CrashRecoveryMachine, "_step", fails_there)
    lines = counterexample(CrashRecoveryMachine)
    program = [line for line in lines if line.startswith("state")]
    last = program[-2].splitlines()[-1]  # (program[-1]: state.teardown())
    # send_message draws "send" or "ask" (which one the first failing example has
    # depends on every rule the machine has)
    kinds = ("send", "ask") if kind == "send" else (kind,)
    assert last.startswith(tuple(f"state._step(Step(kind={k!r}" for k in kinds)), lines
    assert not any("data=data(" in line for line in program), lines
    assert not any(line.startswith(f"state.{rule}(") for line in lines), lines


@pytest.mark.parametrize("enabled_before", [True, False])
def test_an_example_runs_without_automatic_collections(enabled_before: bool) -> None:
    """While an example runs the collector makes no passes of its own (each crash
    collects in full); after its teardown it is as it was before."""
    import gc

    was = gc.isenabled()
    (gc.enable if enabled_before else gc.disable)()
    try:
        machine = CrashRecoveryMachine()
        try:
            assert not gc.isenabled()
            machine.harness.run(Step("create_root", "ada"), crash_at=1)
            machine.harness.crash_and_recover("power")
            assert not gc.isenabled()
        finally:
            machine.teardown()
        assert gc.isenabled() is enabled_before
    finally:
        (gc.enable if was else gc.disable)()
