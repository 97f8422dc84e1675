"""The ``paced`` provider: the model name sets the pause per turn, a ``@pace`` line one turn's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from substrat import demo
from substrat.demo import PacedProvider, pace_seconds, turn_pause_s
from substrat.errors import ProviderError
from tests.support.context import RecordingContext


def test_a_pace_line_sets_one_turns_pause_and_the_model_the_rest() -> None:
    assert pace_seconds("3000ms") == 3.0
    assert turn_pause_s("no pace here", 0.02) == 0.02
    assert turn_pause_s("@pace 3000ms", 0.02) == 3.0
    assert turn_pause_s("@pace 0ms take no time", 5.0) == 0.0
    assert turn_pause_s("a notice first\n@pace 1500ms this one is cut\n@pace 9ms", 0.02) == 1.5
    # Only at the start of a line, and only the word itself.
    assert turn_pause_s("say @pace 3000ms", 0.02) == 0.02
    assert turn_pause_s(" @pace 3000ms", 0.02) == 0.02
    assert turn_pause_s("@paced 3000ms", 0.02) == 0.02


@pytest.mark.parametrize("line", ["@pace 3s", "@pace 10001ms", "@pace fast", "@pace -1ms"])
def test_a_malformed_pace_line_fails_the_turn_and_says_why(line: str) -> None:
    with pytest.raises(ProviderError, match="must be a pause like '40ms'"):
        turn_pause_s(f"hello\n{line}", 0.02)


def test_a_paced_turn_sleeps_its_own_pause_and_answers_as_scripted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def record(delay: float, *args: Any) -> Any:
        slept.append(delay)
        return await real_sleep(0, *args)

    monkeypatch.setattr(demo.asyncio, "sleep", record)

    async def turns() -> list[str]:
        session = await PacedProvider().create("8000ms", "", RecordingContext())
        answers = []
        for prompt in ("first\n@pace 20ms", "second", "@pace 0ms\n@spawn helper"):
            answers.append("".join([chunk async for chunk in session.send(prompt)]))
        return answers

    answers = asyncio.run(turns())
    assert slept == [0.02, 8.0, 0.0]
    assert [a.split(" ", 1)[0] for a in answers] == ["#1", "#2", "#3"]
    assert "spawn_agent" in answers[2]  # the other directives still act
