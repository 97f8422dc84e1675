"""faultfs.stateful refuses the mistakes that would let a crash test pass without testing.

I/O outside the machine's root, a run that acknowledged nothing, Hypothesis's own
``rule``: each fails with what to do, as explore and the fixtures do. And the
drawn crash lands inside the step it crashes, not mostly past its end.
"""

from __future__ import annotations

import collections
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize as hypothesis_initialize
from hypothesis.stateful import invariant as hypothesis_invariant
from hypothesis.stateful import rule as hypothesis_rule
from hypothesis.stateful import run_state_machine_as_test

from faultfs import FailedHealthCheck, HealthCheck, OutsideRootError
from faultfs.errors import ConfigError
from faultfs.stateful import Crash, CrashStateMachine, rule

FAST = settings(
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    max_examples=30,
    stateful_step_count=6,
    deadline=None,
    derandomize=True,
    database=None,
)


def durable_append(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, data)
    os.fsync(fd)
    os.close(fd)
    dfd = os.open(os.path.dirname(path), os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)


class Log:
    """Appends lines durably to ``path``: correct, so only the test's mistakes can fail it."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            with open(path, "rb") as handle:
                self.lines = handle.read().splitlines()
        except FileNotFoundError:
            self.lines = []

    def add(self, line: bytes) -> None:
        durable_append(self.path, line + b"\n")
        self.lines.append(line)


class LogMachine(CrashStateMachine):
    profiles = ("posix",)
    where: str | None = None  # None: under the root

    def recover(self) -> None:
        self.log = Log(self.where or self.fs.path("log"))

    @rule(line=st.sampled_from([b"a", b"b"]))
    def add(self, line: bytes) -> None:
        with self.acknowledging(line):
            self.log.add(line)

    def observe(self) -> list[bytes]:
        return self.log.lines

    def expected(self, acked: list[Any]) -> list[bytes]:
        return list(acked)


# ---------------------------------------------------------------- outside the root


def test_io_outside_the_root_is_refused_not_sent_to_the_real_disk(tmp_path: Path) -> None:
    real = tmp_path / "log"

    class Outside(LogMachine):
        where = str(real)  # the store's default location, not the root

    with pytest.raises(OutsideRootError) as caught:
        Outside()  # recover() opens the real path
    assert f"open({str(real)!r})" in str(caught.value)
    assert not real.exists()

    class LateOutside(LogMachine):
        @rule()
        def stray(self) -> None:
            durable_append(str(real), b"x")

    state = LateOutside()
    with pytest.raises(OutsideRootError):
        state.stray(crash=None)
    with pytest.raises(OutsideRootError):
        state.stray(crash=Crash(at=2, mode="power"))
    assert not real.exists()


def test_a_swallowed_refusal_fails_the_outside_root_health_check(tmp_path: Path) -> None:
    real = tmp_path / "cache"

    class Swallowing(LogMachine):
        @rule()
        def add_and_cache(self) -> None:
            with self.acknowledging(b"c"):
                self.log.add(b"c")
            try:  # a library that treats an unwritable cache as no cache
                real.write_text("x")
            except OSError:
                pass

    state = Swallowing()
    with pytest.raises(FailedHealthCheck) as caught:
        state.add_and_cache(crash=None)
    assert caught.value.health_check is HealthCheck.outside_root
    message = str(caught.value)
    assert "Swallowing's add_and_cache() made 1 call(s) on paths outside the root" in message
    assert "outside = 'passthrough'" in message and "self.fs.path('name')" in message

    class Allowed(Swallowing):
        outside = "passthrough"
        suppress_health_check = (HealthCheck.outside_root,)

    state = Allowed()
    state.add_and_cache(crash=None)
    state.add_and_cache(crash=Crash(at=1, mode="power"))
    assert real.read_text() == "x"  # passed through, as asked


def test_tempfiles_in_the_default_temporary_directory_are_refused_with_the_fix() -> None:
    tempfile.gettempdir()  # tempfile finds its directory once, before the test

    class Staging(LogMachine):
        @rule()
        def stage(self) -> None:
            fd, _name = tempfile.mkstemp()  # persist-queue's default: the real /tmp
            os.close(fd)

    state = Staging()
    with pytest.raises(OutsideRootError) as caught:
        state.stage(crash=None)
    assert "tempfile's default directory" in str(caught.value)
    assert "dir=fs.path('tmp')" in str(caught.value)


def test_the_outside_policy_is_checked_at_class_definition() -> None:
    with pytest.raises(ConfigError, match="outside must be 'refuse' or 'passthrough'"):

        class Bad(LogMachine):
            outside = "allow"

    with pytest.raises(ConfigError, match="suppress_health_check got 'outside'"):

        class Misspelled(LogMachine):
            suppress_health_check = ("outside",)

    with pytest.raises(ConfigError, match=r"mean suppress_health_check = \('outside_root',\)"):

        class NotATuple(LogMachine):
            suppress_health_check = "outside_root"  # type: ignore[assignment]


# ------------------------------------------------------------ nothing acknowledged


class ForgetfulMachine(LogMachine):
    """Adds lines but never acknowledges them: any loss passes."""

    @rule(line=st.sampled_from([b"a", b"b"]))
    def add(self, line: bytes) -> None:
        self.log.add(line)

    def observe(self) -> list[bytes]:
        return []

    def expected(self, acked: list[Any]) -> list[bytes]:
        return []


def run_test_case(machine: type[CrashStateMachine]) -> None:
    case = machine.TestCase
    case.settings = FAST
    case("runTest").runTest()


def test_a_run_that_acknowledged_nothing_fails_the_health_check() -> None:
    with pytest.raises(FailedHealthCheck) as caught:
        run_test_case(ForgetfulMachine)
    assert caught.value.health_check is HealthCheck.nothing_acknowledged
    message = str(caught.value)
    assert "ForgetfulMachine ran" in message and "crashed step(s), and acknowledged nothing" in (
        message
    )
    assert "with self.acknowledging(effect):" in message
    run_test_case(LogMachine)  # the same store, acknowledged: passes

    class OnPurpose(ForgetfulMachine):
        suppress_health_check = ("nothing_acknowledged",)

    run_test_case(OnPurpose)


# ------------------------------------------------------------ Hypothesis's decorators


def test_hypothesis_own_rule_is_refused_with_the_import_to_use() -> None:
    with pytest.raises(ConfigError) as caught:

        class WrongRule(LogMachine):
            @hypothesis_rule(line=st.just(b"x"))
            def put(self, line: bytes) -> None:
                self.log.add(line)

    message = str(caught.value)
    assert "WrongRule.put is decorated with hypothesis.stateful.rule" in message
    assert "from faultfs.stateful import rule" in message

    with pytest.raises(ConfigError, match=r"from faultfs\.stateful import initialize"):

        class WrongInitialize(LogMachine):
            @hypothesis_initialize()
            def start(self) -> None:
                pass

    with pytest.raises(ConfigError, match=r"from faultfs\.stateful import invariant"):

        class WrongInvariant(LogMachine):
            @hypothesis_invariant()
            def holds(self) -> None:
                pass


# ------------------------------------------------------------ where crashes land


def test_crashes_land_inside_the_step_most_of_the_time() -> None:
    """A step passes 8 boundaries; max_crash_at is 64. Drawn uniformly, 1 crash in 8 would land
    inside it; learned from the example's earlier steps, most do."""
    landed: collections.Counter[str] = collections.Counter()

    class Counting(LogMachine):
        def _run_step(self, function: Any, arguments: Any, plan: Crash | None) -> Any:
            if plan is not None:
                landed["inside" if plan.at <= 8 else "after"] += 1
            return super()._run_step(function, arguments, plan)

    run_state_machine_as_test(Counting, settings=settings(FAST, max_examples=60))
    assert landed.total() >= 30, landed
    assert landed["inside"] >= 0.4 * landed.total(), landed
