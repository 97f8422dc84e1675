"""oracle.bench_calls: every Python call counted once, charged to the part it ran in."""

from __future__ import annotations

from oracle.bench_calls import ALL, counting
from oracle.bench_profile import ENGINE, Hook


class Box:
    def outer(self) -> int:
        return self.inner() + len("ab")

    def inner(self) -> int:
        return abs(-1) + abs(-2)

    def inherited(self) -> int:
        return abs(-3)


def test_each_call_is_charged_to_the_innermost_hooked_part_and_the_wrappers_to_none() -> None:
    box = Box()
    original = Box.__dict__["outer"]
    hooks = [Hook("outer", Box, "outer"), Hook("inner", Box, "inner")]
    with counting(hooks) as counted:
        box.outer()
    # outer: its own frame and len; inner: its frame and two abs (the wrappers: nothing)
    assert counted.calls["outer"] == 2
    assert counted.calls["inner"] == 3
    assert counted.calls[ALL] == sum(n for part, n in counted.calls.items() if part != ALL)
    assert Box.__dict__["outer"] is original  # the hooks are taken off again


def test_an_inheriting_hook_charges_its_caller_s_part_and_unhooked_calls_go_to_the_engine() -> None:
    box = Box()
    hooks = [Hook("outer", Box, "outer"), Hook("own", Box, "inherited", inherit=True)]
    with counting(hooks) as counted:
        box.inherited()  # called alone: its own part
        abs(-4)  # outside every hook: the engine's
    assert counted.calls["own"] == 2
    assert counted.calls[ENGINE] >= 1

    class Calls(Box):
        def outer(self) -> int:
            return self.inherited()

    with counting([Hook("caller", Calls, "outer"), Hook("own", Box, "inherited", True)]) as c:
        Calls().outer()
    assert c.calls["caller"] == 3  # outer's frame, inherited's frame and its abs
    assert "own" not in c.calls
