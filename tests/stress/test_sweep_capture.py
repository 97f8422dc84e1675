"""The sweep's captured crash states equal those found by re-running to each boundary,
over scenarios, profiles and shares (with recovery crashed, and on the OpenAI provider);
see tests/integration/test_sweep_capture_smoke.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from faultfs import MODES
from oracle.sweep import SCENARIOS
from tests.support.chat_server import ChatServer
from tests.support.directive_chat import directive_responder, openai_registry
from tests.support.sweep_rerun import captured_states, first_difference, rerun_states

pytestmark = pytest.mark.stress

CASES = [
    # Compaction's fourth fifth and deletion's seventh and eighth eighths, each as its two
    # halves, the same boundaries (oracle.sweep.share_of): whole, each cost 1.8-1.9 CPU s
    # under ci, over 1.4% of the campaign (docs/benchmarks.md, the twelfth pass).
    ("checkpoints and compaction", "lazyfs", (6, 10)),
    ("checkpoints and compaction", "lazyfs", (7, 10)),
    ("checkpoints and deletion", "posix", (12, 16)),
    ("checkpoints and deletion", "posix", (13, 16)),
    ("checkpoints and deletion", "posix", (14, 16)),
    ("checkpoints and deletion", "posix", (15, 16)),
    ("terminations", "posix", (2, 3)),
    ("broadcast", "ext4-ordered", (1, 3)),
    ("messages both ways", "lazyfs", (0, 2)),
    ("evictions", "posix", (1, 2)),
]


def _id(case: tuple[str, str, tuple[int, int]]) -> str:
    name, profile, (index, count) = case
    return f"{name}-{index + 1}of{count}-{profile}"


@pytest.mark.parametrize(("name", "profile", "share"), CASES, ids=[_id(c) for c in CASES])
def test_captured_states_equal_rerun_states(
    name: str, profile: str, share: tuple[int, int]
) -> None:
    options = {"profile": profile, "share": share, "modes": MODES, "images_per_mode": 4}
    old = rerun_states(SCENARIOS[name], **options)  # type: ignore[arg-type]
    new = captured_states(SCENARIOS[name], **options)  # type: ignore[arg-type]
    assert old and first_difference(old, new) is None, first_difference(old, new)


@pytest.fixture(scope="module")
def chat_server() -> Iterator[ChatServer]:
    with ChatServer(directive_responder) as server:
        yield server


def test_captured_states_equal_rerun_states_on_openai(chat_server: ChatServer) -> None:
    options = {
        "profile": "posix",
        "share": (1, 4),
        "modes": ("process", "power", "torn"),
        "images_per_mode": 2,
        "recovery_crashes": False,
        "registry": lambda: openai_registry(chat_server),
        "provider": "openai",
    }
    old = rerun_states(SCENARIOS["stranded reply"], **options)  # type: ignore[arg-type]
    new = captured_states(SCENARIOS["stranded reply"], **options)  # type: ignore[arg-type]
    assert old and first_difference(old, new) is None, first_difference(old, new)
