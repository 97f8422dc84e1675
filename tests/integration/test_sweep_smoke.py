"""A small, fast slice of the exhaustive sweep, so the default run exercises it."""

from __future__ import annotations

from oracle.sweep import SCENARIOS, Scenario, sweep
from oracle.workload import Step


def test_roots_scenario_survives_every_process_and_power_crash() -> None:
    result = sweep(SCENARIOS["roots"], modes=("process", "power"), recovery_crashes=False)
    assert result.boundaries > 20
    assert result.states == 2 * result.boundaries
    assert not result.failures, "\n\n".join(result.failures)


def test_sweep_reports_a_lost_acknowledged_operation(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The sweep is not blind: drop the event log's fsync and it must fail."""
    from substrat import persistence

    real = persistence.fsync_fd

    def no_log_fsync(fd: int, what: object) -> None:
        if str(what).endswith("events.jsonl") and "/agents/" in str(what):
            return  # the agents' logs only (the root registry's has its own test)
        real(fd, what)

    monkeypatch.setattr(persistence, "fsync_fd", no_log_fsync)
    scenario = Scenario("one turn", (Step("create_root", "ada"), Step("turn", "ada")))
    result = sweep(scenario, modes=("power",), recovery_crashes=False, max_failures=1)
    assert result.failures, "a log that is never fsynced must lose acknowledged entries"
    assert "lost" in result.failures[0] or "matches no allowed outcome" in result.failures[0]
