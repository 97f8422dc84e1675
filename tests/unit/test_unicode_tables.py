"""A child pytest in a scratch directory gets this run's Hypothesis Unicode tables, and
nothing else of its storage (tests/support/unicode_tables.py)."""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

from hypothesis import find
from hypothesis import strategies as st

from tests.support.pytest_run import run_pytest
from tests.support.unicode_tables import UNICODE_DATA, give_unicode_tables, own_unicode_data

NO_DRAWS = "def test_nothing():\n    pass\n"

DRAWS_TEXT = """\
from hypothesis import given, settings, strategies as st

@settings(database=None, max_examples=20)
@given(st.text())
def test_text(s):
    assert isinstance(s, str)
"""


def built_tables() -> Path:
    """This process's tables, built by a text draw if it had none yet."""
    find(st.text(min_size=1), lambda s: True)
    ours = own_unicode_data()
    assert ours is not None, "a text draw left no Unicode tables in Hypothesis's storage"
    return ours


def files(top: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(top)): path.read_bytes() for path in top.rglob("*") if path.is_file()
    }


def test_a_child_run_gets_the_tables_and_no_other_storage(tmp_path: Path) -> None:
    ours = built_tables()
    (tmp_path / "test_nothing.py").write_text(NO_DRAWS)
    run = run_pytest(tmp_path, "test_nothing.py")
    assert run.returncode == 0, run.stdout + run.stderr
    storage = tmp_path / ".hypothesis"
    assert os.listdir(storage) == [UNICODE_DATA]  # no example database, no constants
    given = files(storage / UNICODE_DATA)
    assert given and given == files(ours)


def test_a_child_that_draws_text_reads_the_tables_it_was_given(tmp_path: Path) -> None:
    built_tables()
    assert give_unicode_tables(tmp_path)
    assert not give_unicode_tables(tmp_path)  # its own are left alone
    # the tables of this Python's Unicode version (a checkout may hold other versions' too)
    charmap = tmp_path / ".hypothesis" / UNICODE_DATA / unicodedata.unidata_version
    charmap /= "charmap.json.gz"
    before = os.stat(charmap).st_ino
    (tmp_path / "test_text.py").write_text(DRAWS_TEXT)
    run = run_pytest(tmp_path, "test_text.py")
    assert run.returncode == 0, run.stdout + run.stderr
    # Building the table writes a new file over the name; reading it leaves this one.
    assert os.stat(charmap).st_ino == before
