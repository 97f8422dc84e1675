"""A small, fast slice of the exhaustive sweep, so the default run exercises it."""

from __future__ import annotations

import os

import pytest

from oracle.sweep import SCENARIOS, Scenario, SweepResult, share_of, shares, sweep
from oracle.workload import Step


def test_roots_scenario_survives_every_process_and_power_crash() -> None:
    result = sweep(SCENARIOS["roots"], modes=("process", "power"), recovery_crashes=False)
    assert result.boundaries > 20
    assert result.states == 2 * result.boundaries
    assert not result.failures, "\n\n".join(result.failures)


ONE_TURN = Scenario("one turn", (Step("create_root", "ada"), Step("turn", "ada")))


def _no_agent_log_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a loss: the agents' event logs are never fsynced (the root registry's log
    has its own test)."""
    from substrat import persistence

    real = persistence.fsync_fd

    def no_log_fsync(fd: int, what: str | os.PathLike[str]) -> None:
        if str(what).endswith("events.jsonl") and "/agents/" in str(what):
            return
        real(fd, what)

    monkeypatch.setattr(persistence, "fsync_fd", no_log_fsync)


def test_sweep_reports_a_lost_acknowledged_operation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep is not blind: drop the event log's fsync and it must fail."""
    _no_agent_log_fsync(monkeypatch)
    result = sweep(ONE_TURN, modes=("power",), recovery_crashes=False, max_failures=1)
    assert result.failures, "a log that is never fsynced must lose acknowledged entries"
    assert "lost" in result.failures[0] or "matches no allowed outcome" in result.failures[0]


@pytest.mark.parametrize("boundaries", [0, 1, 2, 7, 30, 31, 246])
@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_the_shares_of_a_sweeps_boundaries_are_disjoint_and_all_of_them(
    boundaries: int, count: int
) -> None:
    parts = [list(share_of(boundaries, share)) for share in shares(count)]
    together = sorted(b for part in parts for b in part)
    assert together == list(range(1, boundaries + 1))  # all, and none twice
    if boundaries >= 4 * count:  # blocks of consecutive boundaries, the later ones shorter
        assert all(len(part) > 0 for part in parts)
        assert all(part == list(range(part[0], part[-1] + 1)) for part in parts)
        assert len(parts[0]) >= len(parts[-1])


def test_a_sweep_run_in_shares_checks_what_the_whole_sweep_checks() -> None:
    """The stress campaign runs each sweep as several items (``share=(k, n)``): together
    they crash at every boundary once and check as many crash and recovery-crash states
    as the sweep run whole."""

    def run(share: tuple[int, int]) -> SweepResult:
        return sweep(SCENARIOS["roots"], modes=("process", "power"), images_per_mode=1, share=share)

    whole = run((0, 1))
    parts = [run(share) for share in shares(3)]
    assert whole.swept == list(range(1, whole.boundaries + 1))
    assert sorted(b for part in parts for b in part.swept) == whole.swept
    assert all(part.boundaries == whole.boundaries for part in parts)
    assert sum(part.states for part in parts) == whole.states
    assert sum(part.recovery_states for part in parts) == whole.recovery_states > 0
    assert not whole.failures and not any(part.failures for part in parts)


def test_verdicts_shared_across_profiles_fail_the_same_states(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tests/stress/test_sweep.py sweeps each block on the three profiles with one memo of
    verdicts (``verdicts=``): a state another profile already checked takes its verdict.
    With a planted loss, every profile reports failing exactly the states it reports
    when swept alone, and fewer states are recovered in all."""
    _no_agent_log_fsync(monkeypatch)
    options = {"modes": ("process", "power", "torn"), "images_per_mode": 2, "max_failures": 10**6}

    def failing(result: SweepResult) -> set[str]:
        suffix = " (same disk and model as an earlier failure)"
        return {f.split("\n")[0].removesuffix(suffix) for f in result.failures}

    shared: dict[bytes, str | None] = {}
    alone, together = {}, {}
    for profile in ("posix", "ext4-ordered", "lazyfs"):
        alone[profile] = sweep(ONE_TURN, profile=profile, **options)  # type: ignore[arg-type]
        together[profile] = sweep(ONE_TURN, profile=profile, verdicts=shared, **options)  # type: ignore[arg-type]
    for profile, result in alone.items():
        assert failing(result), f"{profile}: the planted loss must fail some states"
        assert failing(together[profile]) == failing(result), profile
        assert together[profile].states == result.states
        assert together[profile].recovery_states == result.recovery_states
    assert sum(r.distinct for r in together.values()) < sum(r.distinct for r in alone.values())
