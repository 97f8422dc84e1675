"""A small, fast slice of the exhaustive sweep, so the default run exercises it."""

from __future__ import annotations

import itertools
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


def test_a_point_like_an_earlier_one_takes_its_verdicts_without_building_its_images(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A crash point whose faultfs and oracle models equal an earlier point's (the crash
    after one call and the crash before the next) has the same images: the sweep gives
    them their verdicts without building them (half of the points), and with a planted
    loss it fails exactly the states it fails checking every image of every point."""
    from faultfs import FaultFS

    _no_agent_log_fsync(monkeypatch)
    built: list[int] = []
    real = FaultFS.crash_images

    def counted(self: FaultFS, *args: object, **kwargs: object) -> object:
        built.append(self.boundaries)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(FaultFS, "crash_images", counted)
    options = {"modes": ("process", "power", "torn"), "images_per_mode": 2, "max_failures": 10**6}
    memo = sweep(ONE_TURN, recovery_crashes=False, **options)  # type: ignore[arg-type]
    points = len(memo.swept)
    assert len(built) < 0.7 * points * 3, f"{len(built)} image sets built for {points} points"
    built.clear()
    every = sweep(ONE_TURN, recovery_crashes=False, dedupe=False, **options)  # type: ignore[arg-type]
    assert len(built) == points * 3
    suffix = " (same disk and model as an earlier failure)"
    assert memo.failures and memo.states == every.states
    assert sorted(f.split("\n")[0].removesuffix(suffix) for f in memo.failures) == sorted(
        f.split("\n")[0] for f in every.failures
    )


def test_a_point_key_tells_apart_points_an_fsync_alone_separates() -> None:
    """The same visible files and model but a different durable layer (an fsync between
    the two points) is a different point: its power image differs."""
    from oracle.harness import CrashHarness
    from oracle.sweep import capture, count_boundaries, model_key, point_key

    total = count_boundaries(ONE_TURN, "posix")
    harness = CrashHarness(profile="posix", slots=ONE_TURN.slots)
    points = capture(harness, ONE_TURN.steps, range(1, total + 1))
    pairs = list(itertools.pairwise(points))
    same = [
        (a, b)
        for a, b in pairs
        if a.fs.content_fingerprint() == b.fs.content_fingerprint()
        and model_key(a.model) == model_key(b.model)
    ]
    apart = [(a, b) for a, b in same if point_key(a.fs) != point_key(b.fs)]
    assert apart and len(apart) < len(same)  # the after of one call, the before of the next
    for a, b in apart:
        process = [p.fs.crash_image("process").content_fingerprint() for p in (a, b)]
        assert process[0] == process[1]
    assert any(
        a.fs.crash_image("power").content_fingerprint()
        != b.fs.crash_image("power").content_fingerprint()
        for a, b in apart
    )


def test_a_share_runs_the_scenario_up_to_its_last_boundary_and_counts_it_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each share needs the scenario's boundary count (a run of it): counted once a
    process; the capture stops after the share's last boundary."""
    from oracle import sweep as sweep_module
    from oracle.harness import CrashHarness

    scenario = Scenario("one turn, counted", ONE_TURN.steps)
    counts: list[str] = []
    real = sweep_module.count_boundaries

    def counted(scenario: Scenario, profile: str, **options: object) -> int:
        counts.append(profile)
        return real(scenario, profile, **options)

    monkeypatch.setattr(sweep_module, "count_boundaries", counted)
    for share in shares(3):
        for profile in ("posix", "lazyfs"):
            sweep(scenario, profile=profile, modes=("process",), share=share)
    assert sorted(counts) == ["lazyfs", "posix"]
    total = real(scenario, "posix")
    harness = CrashHarness(profile="posix", slots=scenario.slots)
    start = harness.fs.boundaries
    first = share_of(total, (0, 3))
    assert len(sweep_module.capture(harness, scenario.steps, first)) == len(first)
    assert harness.fs.boundaries - start < total


@pytest.mark.parametrize("collecting", [True, False])
def test_a_sweep_holds_the_interception_and_the_collector_and_gives_them_back(
    collecting: bool,
) -> None:
    """Every state is checked with faultfs's interception held (its disk's activation a
    push on the hold, not a patch of every intercepted function with a full collection
    at its end) and the collector off; after the sweep both are as they were."""
    import gc

    from faultfs import _intercept
    from oracle.harness import HOLD_ROOT

    seen: list[tuple[bool, list[str]]] = []

    def look(harness: object, image: object, model: object, label: str) -> None:
        with image:  # type: ignore[attr-defined]  # as the recovery's check activates it
            seen.append((gc.isenabled(), [fs.root for fs in _intercept.active()]))

    (gc.enable if collecting else gc.disable)()
    try:
        sweep(ONE_TURN, modes=("power",), recovery_crashes=False, dedupe=False, check=look)
        after = gc.isenabled()
    finally:
        gc.enable()
    assert seen
    assert all(not enabled for enabled, _ in seen)
    assert all(roots[0] == HOLD_ROOT and len(roots) == 2 for _, roots in seen)
    assert after is collecting
    assert not _intercept.active()


def test_a_sweeps_checks_read_a_log_again_only_where_its_bytes_differ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each state's check keeps what it derived from each log in the harness's memos, keyed
    by the log's bytes on the image (``CrashHarness.check_image``): the images of one point
    and of its neighbours mostly hold the same logs, read once. With a planted loss the
    sweep fails exactly the states it fails when every check reads every log."""
    from oracle import harness as harness_module
    from oracle import reads

    reads_made: list[str] = []
    real_read = reads.read_log

    def counted(path: object, *args: object, **kwargs: object) -> object:
        reads_made.append(str(path))
        return real_read(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(reads, "read_log", counted)
    options = {"modes": ("power",), "dedupe": False}
    # Scenarios of their own: the boundary count is kept a process by scenario, and the
    # planted loss changes it.
    clean = sweep(Scenario("one turn, read", ONE_TURN.steps), recovery_crashes=False, **options)  # type: ignore[arg-type]
    assert not clean.failures, clean.failures[0]
    # every check reads the user's log at least: without the memos, a read each
    assert 0 < len(reads_made) < clean.distinct / 2, (len(reads_made), clean.distinct)

    _no_agent_log_fsync(monkeypatch)
    lossy = Scenario("one turn, read, the logs never fsynced", ONE_TURN.steps)
    kept = sweep(lossy, max_failures=10**6, share=(1, 2), **options)  # type: ignore[arg-type]
    real_check = harness_module.check_recovery
    monkeypatch.setattr(  # the same check with no memos: every log read at every check
        harness_module, "check_recovery", lambda model, orch, **_: real_check(model, orch)
    )
    every = sweep(lossy, max_failures=10**6, share=(1, 2), **options)  # type: ignore[arg-type]
    assert kept.failures and kept.failures == every.failures
    assert (kept.states, kept.recovery_states) == (every.states, every.recovery_states)
