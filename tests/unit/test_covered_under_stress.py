"""A default-run test that a stress test covers skips under ``--run-stress`` (tests/conftest.py).

The main job (``pytest --run-stress``) runs the default tests too; where a stress test
runs the same check on everything a default-run test checks (and more), running both
pays for the small one twice. It skips, saying which test covers it, and only when that
test runs in the same session.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import conftest

COVER = "tests/stress/test_x.py::test_whole"


class FakeItem:
    def __init__(self, nodeid: str, cover: str | None = None) -> None:
        self.nodeid = nodeid
        self.cover = cover
        self.added: list[Any] = []

    def get_closest_marker(self, name: str) -> Any:
        if name != conftest.COVERED_MARK or self.cover is None:
            return None
        return pytest.mark.covered_under_stress(self.cover).mark

    def add_marker(self, marker: Any) -> None:
        self.added.append(marker)


def modify(stress: bool, items: list[FakeItem]) -> None:
    config = SimpleNamespace(getoption=lambda name, default=None: stress)
    conftest.pytest_collection_modifyitems(config, items)  # type: ignore[arg-type]


def skip_reasons(item: FakeItem) -> list[str]:
    return [m.mark.kwargs["reason"] for m in item.added if m.mark.name == "skip"]


def test_a_covered_test_skips_under_stress_and_names_its_cover() -> None:
    small = FakeItem("tests/integration/test_x.py::test_small[3]", cover=COVER)
    modify(True, [small, FakeItem(f"{COVER}[3]"), FakeItem("tests/unit/test_y.py::test_other")])
    assert skip_reasons(small) == [f"covered under --run-stress by {COVER}"]


def test_a_covered_test_runs_without_stress_or_when_its_cover_is_not_run() -> None:
    small = FakeItem("tests/integration/test_x.py::test_small", cover=COVER)
    modify(False, [small, FakeItem(COVER)])  # the default run: the cover skips
    modify(True, [small, FakeItem("tests/stress/test_x.py::test_whole_other")])  # not collected
    assert small.added == []


def _marked_tests() -> list[tuple[str, Any]]:
    """(module, test function) for every test the suite marks as covered."""
    tests = Path(conftest.__file__).parent
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        if f"mark.{conftest.COVERED_MARK}(" not in path.read_text():
            continue
        name = ".".join(path.relative_to(tests.parent).with_suffix("").parts)
        module = importlib.import_module(name)
        found += [(name, f) for f in vars(module).values() if _cover_of(f) is not None]
    return found


def _cover_of(function: Any) -> str | None:
    marks = [m for m in getattr(function, "pytestmark", []) if m.name == conftest.COVERED_MARK]
    return marks[0].args[0] if marks else None


def test_every_named_cover_is_a_stress_test() -> None:
    marked = _marked_tests()
    assert marked, "no test is marked covered_under_stress"
    for name, function in marked:
        path, test = _cover_of(function).split("::")  # type: ignore[union-attr]
        cover_module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        cover = getattr(cover_module, test)
        marks = [m.name for m in getattr(cover, "pytestmark", [])]
        marks += [m.name for m in getattr(cover_module, "pytestmark", [])]
        assert "stress" in marks, f"{name}.{function.__name__}: {path}::{test} is not a stress test"
