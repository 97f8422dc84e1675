"""Code that catches SimulatedCrash and goes on: the dead process's acknowledgements do not count.

A bare ``except:`` or ``except BaseException:`` in the code under test catches
SimulatedCrash. What it acknowledges afterwards must not be recorded (the
check would blame a correct store with a wrong cause): the run stops with
CrashSwallowed, naming the acknowledgement, the crash point and what to do.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from faultfs import CrashSwallowed, FaultFS, HealthCheck, explore
from faultfs.stateful import Crash, CrashStateMachine, rule
from tests.support.faultfs_classic import fsync_dir, machine_settings

FIX = "Re-raise what you do not own there (`except BaseException: ...; raise`)"


def save(path: str, value: int, dir_sync: bool = True) -> None:
    """Temp file, fsync, rename, directory fsync: atomic and durable."""
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(value, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    if dir_sync:
        fsync_dir(os.path.dirname(path))


def swallowing_save(path: str, value: int, dir_sync: bool = True) -> None:
    try:
        save(path, value, dir_sync)
    except BaseException:  # the old-library habit under test
        pass


def test_an_ack_after_the_crash_is_refused_and_not_recorded() -> None:
    fs = FaultFS("/swallow")
    fs.arm(1)
    with fs, pytest.raises(CrashSwallowed) as caught:
        swallowing_save(fs.path("s.json"), 1)
        fs.ack("after-crash")
    assert fs.acked == []
    assert fs.crash_image("power").acked == []
    message = str(caught.value)
    assert "the acknowledgement 'after-crash' at " in message
    assert "after the simulated crash at boundary 1 (before the create of s.json.tmp at" in message
    assert FIX in message


def test_its_first_refused_io_after_the_crash_is_named() -> None:
    fs = FaultFS("/swallow")
    with fs:
        save(fs.path("s.json"), 0)
    fs.arm(1)
    with fs, pytest.raises(CrashSwallowed) as caught:
        swallowing_save(fs.path("s.json"), 1)
        swallowing_save(fs.path("s.json"), 2)  # the dead process goes on writing
        fs.ack(2)
    assert fs.io_after_crash >= 1
    assert "its first I/O after the crash: " in str(caught.value)
    assert "s.json.tmp" in str(caught.value).split("its first I/O after the crash: ")[1]


def swallowing_workload(fs: FaultFS) -> None:
    for value in (1, 2):
        swallowing_save(fs.path("s.json"), value, dir_sync=False)
        fs.ack(value)


def check_value(img: FaultFS) -> None:
    with open(img.path("s.json")) as handle:
        assert json.load(handle) >= max(img.acked, default=0)


def setup_value(fs: FaultFS) -> None:
    save(fs.path("s.json"), 0)


def test_explore_one_run_per_boundary_stops_at_the_ack_after_the_crash() -> None:
    with pytest.raises(CrashSwallowed) as caught:
        explore(
            swallowing_workload,
            check_value,
            setup=setup_value,
            suppress_health_check=[HealthCheck.nondeterministic],
        )
    message = str(caught.value)
    assert "the acknowledgement 1 at " in message
    assert "after the simulated crash at boundary 1 (before the create of s.json.tmp" in message


def test_explore_stops_even_when_the_refusal_is_swallowed_too() -> None:
    def workload(fs: FaultFS) -> None:
        swallowing_save(fs.path("s.json"), 1)
        try:
            fs.ack(1)  # an acknowledgement callback inside the library, say
        except BaseException:  # swallows the refusal too
            pass

    with pytest.raises(CrashSwallowed, match="the acknowledgement 1 at "):
        explore(
            workload,
            check_value,
            setup=setup_value,
            suppress_health_check=[HealthCheck.nondeterministic],
        )


def test_explore_capturing_crash_states_names_only_the_missing_directory_fsync() -> None:
    # The capturing run is never stopped, so nothing is swallowed: the one real bug is found.
    report = explore(swallowing_workload, check_value, setup=setup_value, modes=("power",))
    causes = report.causes()
    assert causes and {cause.kind for cause in causes} == {"entry-not-durable"}


class SwallowingMachine(CrashStateMachine):
    profiles = ("posix",)

    def recover(self) -> None:
        path = self.fs.path("s.json")
        self.value: Any = None
        if os.path.exists(path):
            with open(path) as handle:
                self.value = json.load(handle)

    @rule(value=st.integers(0, 5))
    def store(self, value: int) -> None:
        with self.acknowledging(value):
            swallowing_save(self.fs.path("s.json"), value)
            self.value = value

    def observe(self) -> Any:
        return self.value

    def expected(self, acked: list[Any]) -> Any:
        return acked[-1] if acked else None


def test_the_machine_stops_at_the_ack_after_a_swallowed_crash() -> None:
    state = SwallowingMachine()
    with pytest.raises(CrashSwallowed) as caught:
        state.store(crash=Crash(at=1, mode="process"), value=3)
    assert state.acked == []
    message = str(caught.value)
    assert "the acknowledgement 3 at " in message and "test_faultfs_swallowed_crash.py:" in message
    assert "after the simulated crash at boundary 1" in message and FIX in message


def test_hypothesis_reports_the_swallowed_crash_not_a_lost_value() -> None:
    with pytest.raises(CrashSwallowed, match="after the simulated crash at boundary"):
        run_state_machine_as_test(
            SwallowingMachine, settings=machine_settings(50, derandomize=True)
        )
