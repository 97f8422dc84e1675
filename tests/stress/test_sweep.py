"""The exhaustive sweep: every named scenario, every boundary, mode and image.

Each sweep runs as several items, each crashing at one block of consecutive
boundaries (``oracle.sweep.share_of``): ``pytest -n 64`` is only as fast as its
longest item. Together the items of one sweep crash at every boundary once
(``tests/integration/test_sweep_smoke.py`` shows that the shares are the whole
sweep). An item sweeps its block on every profile, one after the other, sharing
verdicts: a crash state (disk and model) that one profile's images already had
takes the verdict it got there (``sweep(verdicts=...)``); about a third of the
states checked on the three profiles apart are such repeats (the process image is
the same on each, and many others are). Recovery crashes are swept on each profile.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from oracle.sweep import SCENARIOS, shares, sweep
from tests.support.chat_server import ChatServer
from tests.support.directive_chat import directive_responder, openai_registry

pytestmark = pytest.mark.stress

PROFILES = ("posix", "ext4-ordered", "lazyfs")
SHARES = {
    "roots": 1,
    "children": 3,
    "messages both ways": 3,
    "stranded reply": 2,
    "broadcast": 3,
    "evictions": 3,
    "terminations": 5,
    "checkpoints and compaction": 8,
    "checkpoints and deletion": 12,
    "checkpoints and the start summary": 5,
}
"""Items each scripted sweep runs as (each item on every profile). Since each share runs
its scenario once (oracle.sweep captures every boundary of it), the lazyfs sweeps (the
dearest) cost 0.7-9.8 CPU s, all shares together (checkpoints and deletion 9.8,
checkpoints and compaction 8.5, terminations 3.6; one run under ``ci``, load 5-8), and a
split costs next to nothing: 1 to 5 shares of checkpoints
and deletion checked 2,737-2,756 distinct states for 7.6-8.7 CPU s in all. So the
splits stay. With the three profiles in one item, five shares of checkpoints and deletion
cost 2.2-2.9 CPU s each under ``ci``, over 1/64 of that campaign's 140 CPU s; eight
cost 1.1-2.0 each, 11.7-12.2 in all against 13.1 (docs/benchmarks.md, the eighth pass).
Children in three shares, not two: 0.8-1.4 CPU s each against 2.3 and 3.3 (ci, load 4-5).
Twelve of checkpoints and deletion, eight of compaction, five of terminations and of the
start summary, three of messages both ways and of evictions: under ``ci`` their eighths,
fifths, thirds and halves cost up to 2.4, 2.1, 2.2 and 1.8 CPU s of a 133 CPU s campaign
(1/64: 2.1). The sweeps' totals moved no more than the load did (compaction 8.7-11.5 CPU s
in eight shares at load 5-8, 9.2 in five at load 2-4; docs/benchmarks.md, the twelfth pass)."""
OPENAI_SHARES = {"children": 1, "messages both ways": 1, "stranded reply": 1}
"""The same for the OpenAI sweeps: unsplit they cost 13.5, 12.8 and 7.1 CPU s when the
scenario was re-run to each boundary (hence 8, 8 and 4 shares then); captured once, all
their shares together cost 1.9, 2.3 and 0.8 (in 2, 2 and 1 shares: items of 0.3-0.8, the
first one paying the module's chat server), so one item each."""


def _items(counts: dict[str, int]) -> list[tuple[str, tuple[int, int]]]:
    return [(name, share) for name in sorted(counts) for share in shares(counts[name])]


def _id(item: tuple[str, tuple[int, int]]) -> str:
    name, (index, count) = item
    return name if count == 1 else f"{name}-{index + 1}of{count}"


@pytest.mark.parametrize("item", _items(SHARES), ids=_id)
def test_sweep(item: tuple[str, tuple[int, int]], capsys: pytest.CaptureFixture[str]) -> None:
    name, share = item
    verdicts: dict[bytes, str | None] = {}  # shared by the profiles' sweeps of this block
    for profile in PROFILES:
        result = sweep(SCENARIOS[name], profile=profile, share=share, verdicts=verdicts)
        with capsys.disabled():
            print(
                f"\nsweep {name} [{profile}] share {share[0] + 1} of {share[1]}: "
                f"{len(result.swept)} of {result.boundaries} boundaries, "
                f"{result.states} crash states + {result.recovery_states} recovery-crash "
                f"states ({result.distinct} checked here) in {result.seconds:.1f} s"
            )
        assert result.swept, f"share {share} of {name} has no boundary: fewer shares"
        assert result.states >= len(result.swept) * 2  # at least process and power everywhere
        assert not result.failures, f"[{profile}] " + "\n\n".join(result.failures)


@pytest.fixture(scope="module")
def chat_server() -> Iterator[ChatServer]:
    with ChatServer(directive_responder) as server:
        yield server


def test_every_scenario_is_swept_whole() -> None:
    """Every scenario is split into shares (0..n-1 of n), so the items sweep it whole."""
    assert set(SHARES) == set(SCENARIOS)
    assert set(OPENAI_SHARES) <= set(SCENARIOS)
    for counts in (SHARES, OPENAI_SHARES):
        for name, count in counts.items():
            assert [share for n, share in _items(counts) if n == name] == shares(count)


@pytest.mark.parametrize("item", _items(OPENAI_SHARES), ids=_id)
def test_sweep_openai(item: tuple[str, tuple[int, int]], chat_server: ChatServer) -> None:
    """Every tool-call round cut at every boundary recovers to a conversation the endpoint
    accepts and that equals the acknowledged transcripts."""
    name, share = item
    result = sweep(
        SCENARIOS[name],
        profile="posix",
        modes=("process", "power", "torn"),
        images_per_mode=2,
        recovery_crashes=False,
        registry=lambda: openai_registry(chat_server),
        provider="openai",
        share=share,
    )
    assert result.swept, f"share {share} of {name} has no boundary: fewer shares"
    assert not result.failures, "\n\n".join(result.failures)
    assert not chat_server.rejected(), chat_server.rejected()[0]
