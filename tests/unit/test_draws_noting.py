"""The fuzzers' draws ask whether notes print once a test case, not at every draw.

``oracle.draws.pick``/``integer``/``flag``/``draw`` go through ``data.draw`` (each
draw shown with its label) only when notes print: the replay that prints a
counterexample, or a verbose run. That answer holds for a whole test case, and on
the Hypothesis CI runs an ask costs about 14 us, so it is asked once a test case
(:func:`oracle.draws.noting`). A failing example's replay is a test case of its
own: it must still show every draw.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle import draws

AGENTS = ["ada", "bob", "cy"]


def _draws(data: st.DataObject) -> tuple[str, int, bool, str]:
    return (
        draws.pick(data, AGENTS, "agent"),
        draws.integer(data, 0, 9, "boundary"),
        draws.flag(data, "crash"),
        draws.draw(data, st.sampled_from(AGENTS), "other"),
    )


def test_whether_notes_print_is_asked_once_a_test_case(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[bool] = []
    real = draws.should_note

    def counted() -> bool:
        answer = real()
        asked.append(answer)
        return answer

    monkeypatch.setattr(draws, "should_note", counted)
    cases: list[int] = []

    @settings(max_examples=25, database=None, deadline=None)
    @given(st.data())
    def body(data: st.DataObject) -> None:
        cases.append(1)
        for _ in range(4):
            _draws(data)

    body()
    assert cases
    assert len(asked) == len(cases)  # 16 draws a test case, one ask each
    assert not any(asked)


def test_a_counterexample_still_shows_every_draw_with_its_label() -> None:
    @settings(max_examples=200, database=None, deadline=None)
    @given(st.data())
    def body(data: st.DataObject) -> None:
        agent, boundary, crash, _other = _draws(data)
        assert not (agent == "cy" and boundary > 4 and crash), "planted failure"

    with pytest.raises(AssertionError, match="planted failure") as failed:
        body()
    notes = "\n".join(getattr(failed.value, "__notes__", []))
    for label in ("agent", "boundary", "crash", "other"):
        assert f"({label})" in notes, notes
    assert "'cy'" in notes, notes
