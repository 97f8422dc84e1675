"""A skip reason built from a child's failure names the failure, not a cut-off frame."""

from __future__ import annotations

from tests.support.privileges import last_line

TRACEBACK = """Traceback (most recent call last):
  File "<string>", line 1, in <module>
  File "/work/x/substrat/cli/__init__.py", line 19, in <module>
    import click
ModuleNotFoundError: No module named 'click'
"""


def test_a_traceback_gives_its_exception_line() -> None:
    assert last_line(TRACEBACK) == "ModuleNotFoundError: No module named 'click'"


def test_a_long_line_is_cut_between_words_and_says_so() -> None:
    line = "PermissionError: " + " ".join(f"word{n}" for n in range(100))
    reason = last_line(line, limit_chars=50)
    assert reason.endswith(" ...")
    assert len(reason) <= 54
    kept = reason.removesuffix(" ...").split(" ")
    assert all(word in line.split(" ") for word in kept)


def test_no_output_is_said_plainly() -> None:
    assert last_line("\n  \n") == "no output"
