"""The exhaustive sweep: every named scenario, every boundary, mode and image."""

from __future__ import annotations

import pytest

from oracle.sweep import SCENARIOS, sweep

pytestmark = pytest.mark.stress


@pytest.mark.parametrize("profile", ["posix", "ext4-ordered", "lazyfs"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_sweep(name: str, profile: str, capsys: pytest.CaptureFixture[str]) -> None:
    result = sweep(SCENARIOS[name], profile=profile)
    with capsys.disabled():
        print(
            f"\nsweep {name} [{profile}]: {result.boundaries} boundaries, "
            f"{result.states} crash states + {result.recovery_states} recovery-crash states "
            f"in {result.seconds:.1f} s ({result.rate:.0f}/s)"
        )
    assert result.boundaries > 0
    assert result.states >= result.boundaries * 2  # at least process and power everywhere
    assert not result.failures, "\n\n".join(result.failures)
