"""The few lines a recovery's report becomes (``substrat recover``, ``watch``)."""

from __future__ import annotations

from substrat.cli import render


def test_a_start_that_set_the_checkpoints_aside_says_why() -> None:
    why = "the log of 4f2c is damaged (bad_checksum)"
    lines = render.recovery_lines({"report": {"agents": 2, "checkpoints_set_aside": why}})
    (line,) = [x for x in lines if "checkpoints set aside" in x]
    assert why in line and "every log read from its start" in line


def test_a_start_that_used_its_checkpoints_says_nothing_of_them() -> None:
    lines = render.recovery_lines({"report": {"agents": 2, "checkpoints_set_aside": None}})
    assert not [x for x in lines if "checkpoints" in x]
