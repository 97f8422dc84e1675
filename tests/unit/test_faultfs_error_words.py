"""A failed check's error line names an exception that carries no message by its type
alone: ``EOFError``, not ``EOFError: `` (pickle and joblib raise it bare on a cut file)."""

from __future__ import annotations

import os
from typing import Any

from faultfs import explore
from faultfs._wording import exception_words


def _save(fs: Any) -> None:
    with open(os.path.join(fs.root, "data"), "wb") as f:
        f.write(b"payload")
    fs.ack("saved")


def _load(img: Any) -> None:
    path = os.path.join(img.root, "data")
    if "saved" in img.acked and (not os.path.exists(path) or os.path.getsize(path) == 0):
        raise EOFError()


def test_a_bare_exception_is_named_by_its_type_alone() -> None:
    report = explore(_save, _load, modes="power")
    assert report.failures, str(report)
    errors = {f.error for f in report.failures}
    assert errors == {"EOFError"}, errors
    assert "EOFError: \n" not in str(report) and not str(report).endswith("EOFError: ")


def test_an_exception_with_a_message_keeps_it() -> None:
    assert exception_words(ValueError("bad byte")) == "ValueError: bad byte"
    assert exception_words(EOFError()) == "EOFError"
