"""CrashHarness.crash_and_recover with a recovery crash: where it lands decides what is checked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from oracle.harness import CrashHarness
from oracle.machines import MAX_RECOVERY_BOUNDARY
from oracle.workload import Step
from substrat.orchestrator import Orchestrator


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Orchestrator]]:
    """Every orchestrator Orchestrator.open hands back (a crashed open hands back none)."""
    seen: list[Orchestrator] = []
    original = Orchestrator.open.__func__  # type: ignore[attr-defined]

    async def open_(cls: type[Orchestrator], *args: object, **kwargs: object) -> Orchestrator:
        orch = await original(cls, *args, **kwargs)
        seen.append(orch)
        return orch

    monkeypatch.setattr(Orchestrator, "open", classmethod(open_))
    yield seen


def _crashed_in_a_send() -> CrashHarness:
    """A harness whose send crashed where the recovery after it has work to write
    (20 boundaries on posix, well short of MAX_RECOVERY_BOUNDARY)."""
    harness = CrashHarness()
    harness.run(Step("create_root", "ada"))
    harness.run(Step("spawn", "ada", "bob"))
    assert harness.run(Step("send", "ada", "ada/bob"), crash_at=6).crashed
    return harness


def test_a_recovery_crash_past_recovery_s_end_checks_that_very_recovery(
    opened: list[Orchestrator],
) -> None:
    harness = _crashed_in_a_send()
    opened.clear()
    cycle = harness.crash_and_recover("power", 0, recovery_crash_at=MAX_RECOVERY_BOUNDARY)
    assert not cycle.recovery_crashed
    # one recovery, not a second one on what it left: the one that ran armed is checked
    assert opened == [harness.orch]
    assert 0 < harness.fs.boundaries < MAX_RECOVERY_BOUNDARY  # the image's own: it wrote
    harness.check_running()
    harness.close()


def test_a_recovery_crash_inside_recovery_recovers_again_on_the_crash_image(
    opened: list[Orchestrator],
) -> None:
    harness = _crashed_in_a_send()
    opened.clear()
    cycle = harness.crash_and_recover("power", 0, recovery_crash_at=5)
    assert cycle.recovery_crashed
    assert opened == [harness.orch]  # the crashed open handed back nothing
    assert harness.fs.origin is not None and harness.fs.crashed is False
    harness.check_running()
    harness.close()
