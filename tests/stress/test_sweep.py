"""The exhaustive sweep: every named scenario, every boundary, mode and image."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from oracle.sweep import SCENARIOS, sweep
from tests.support.chat_server import ChatServer
from tests.support.directive_chat import directive_responder, openai_registry

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


@pytest.fixture(scope="module")
def chat_server() -> Iterator[ChatServer]:
    with ChatServer(directive_responder) as server:
        yield server


@pytest.mark.parametrize("name", ["children", "messages both ways", "stranded reply"])
def test_sweep_openai(name: str, chat_server: ChatServer) -> None:
    """Every tool-call round cut at every boundary recovers to a conversation the endpoint
    accepts and that equals the acknowledged transcripts."""
    result = sweep(
        SCENARIOS[name],
        profile="posix",
        modes=("process", "power", "torn"),
        images_per_mode=2,
        recovery_crashes=False,
        registry=lambda: openai_registry(chat_server),
        provider="openai",
    )
    assert result.boundaries > 0
    assert not result.failures, "\n\n".join(result.failures)
    assert not chat_server.rejected(), chat_server.rejected()[0]
