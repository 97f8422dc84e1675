"""faultfs.stateful: Hypothesis state machines whose steps crash, recover and check.

The machines here test a one-file "register" store (the value lives in a file
replaced atomically). Steps are also called directly, with a fixed Crash, to
pin the mechanics: where the crash lands, the in-flight operation, recovery
crashed too, and the cause named in the failure.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from faultfs.errors import ConfigError, RecoveryCheckFailed
from faultfs.stateful import Bundle, Crash, CrashStateMachine, invariant, precondition, rule

# Hypothesis's explain phase replays each failing step many times to annotate
# it; crash steps are costly to replay, so these runs leave it out.
NO_EXPLAIN = tuple(phase for phase in Phase if phase is not Phase.explain)
FAST = settings(
    phases=NO_EXPLAIN,
    max_examples=25,
    stateful_step_count=6,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class Register:
    """The value of one register, kept in ``value.json`` under ``directory``."""

    def __init__(self, directory: str, *, file_sync: bool = True) -> None:
        self.path = os.path.join(directory, "value.json")
        self.directory = directory
        self.file_sync = file_sync
        try:
            with open(self.path) as handle:
                self.value: int = json.load(handle)
        except FileNotFoundError:
            self.value = 0

    def set(self, value: int) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(value, handle)
            handle.flush()
            if self.file_sync:
                os.fsync(handle.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.directory, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        self.value = value


class RegisterMachine(CrashStateMachine):
    file_sync = True

    def recover(self) -> None:
        self.register = Register(self.fs.root, file_sync=self.file_sync)

    @rule(value=st.integers(1, 9))
    def set(self, value: int) -> None:
        with self.acknowledging(value):
            self.register.set(value)

    @rule(crashes=False)
    def read(self) -> None:
        assert self.register.value == self.expected(self.acked)

    def observe(self) -> int:
        return self.register.value

    def expected(self, acked: list[Any]) -> int:
        return acked[-1] if acked else 0


class UnsyncedRegisterMachine(RegisterMachine):
    file_sync = False


def test_a_correct_store_passes_every_profile_and_mode() -> None:
    run_state_machine_as_test(RegisterMachine, settings=FAST)


def test_the_missing_fsync_is_found_with_its_cause() -> None:
    with pytest.raises(RecoveryCheckFailed) as caught:
        run_state_machine_as_test(UnsyncedRegisterMachine, settings=FAST)
    message = str(caught.value)
    assert "cause: data written to value.json.tmp" in message
    assert "was never fsynced before the rename" in message
    assert "fix: fsync the file before the rename" in message


def machine(cls: type[RegisterMachine] = RegisterMachine, profile: str = "posix") -> Any:
    state = cls()
    state.use_profile(profile=profile)
    return state


def test_a_crash_inside_a_step_leaves_the_operation_in_flight() -> None:
    state = machine()
    state.set(crash=None, value=3)
    assert state.acked == [3] and state.crashes == 0
    # Boundary 9 of set(): after the rename, before the directory fsync.
    # Under posix a power cut loses the rename: the old value is recovered.
    state.set(crash=Crash(at=9, mode="power"), value=5)
    assert state.crashes == 1 and state.acked == [3] and state.register.value == 3
    # kill -9 at the same point keeps the rename: the in-flight 5 landed and
    # counts as acknowledged from now on.
    state.set(crash=Crash(at=9, mode="process"), value=7)
    assert state.acked == [3, 7] and state.register.value == 7
    assert state.inflight is None


def test_a_crash_past_the_last_boundary_comes_right_after_the_step() -> None:
    state = machine()
    state.set(crash=Crash(at=64, mode="power"), value=4)
    assert state.acked == [4] and state.register.value == 4  # it was durable


def test_recovery_is_crashed_too_and_recovered_again() -> None:
    class CountingMachine(RegisterMachine):
        recoveries = 0

        def recover(self) -> None:
            type(self).recoveries += 1
            super().recover()
            if type(self).recoveries == 2:  # the first recovery after the crash writes
                self.register.set(self.register.value)

    state = machine(CountingMachine)
    state.set(crash=None, value=2)
    state.set(crash=Crash(at=3, mode="power", recovery_at=1), value=6)
    # __init__, the crashed recovery, and the one on its image.
    assert CountingMachine.recoveries == 3
    assert state.register.value == 2 and state.acked == [2]


def test_the_profile_is_drawn_and_switched_before_the_run() -> None:
    state = RegisterMachine()
    assert state.fs.profile == "posix"
    state.use_profile(profile="lazyfs")
    assert state.fs.profile == "lazyfs" and not state.fs.model.meta_pending
    # Under lazyfs the rename is durable at once: a power cut keeps the value.
    state.set(crash=Crash(at=9, mode="power"), value=8)
    assert state.acked == [8]


def test_a_failing_step_raises_with_the_crash_the_image_and_the_cause() -> None:
    state = machine(UnsyncedRegisterMachine)
    state.set(crash=None, value=1)
    with pytest.raises(RecoveryCheckFailed) as caught:
        state.set(crash=Crash(at=64, mode="power"), value=2)
    message = str(caught.value)
    assert message.startswith("after a power crash right after (it passed 8 boundaries) set()")
    assert "profile posix" in message and "durable state only" in message
    assert "recovery: JSONDecodeError" in message
    assert "cause: data written to value.json.tmp at " in message
    assert "test_faultfs_stateful.py:" in message.split("cause: ", 1)[1]


def test_bundles_preconditions_and_read_only_rules_work_as_in_hypothesis() -> None:
    class Keys(CrashStateMachine):
        profiles = ("posix",)
        names = Bundle("names")

        def recover(self) -> None:
            self.present = sorted(os.listdir(self.fs.root))

        @rule(target=names, name=st.sampled_from("abc"))
        def create(self, name: str) -> str:
            with self.acknowledging(name):
                fd = os.open(self.fs.path(name), os.O_WRONLY | os.O_CREAT, 0o644)
                os.fsync(fd)
                os.close(fd)
                dfd = os.open(self.fs.root, os.O_RDONLY)
                os.fsync(dfd)
                os.close(dfd)
            return name

        @precondition(lambda self: bool(self.acked))
        @rule(name=names, crashes=False)
        def exists(self, name: str) -> None:
            assert os.path.exists(self.fs.path(name)) or name not in self.acked

        @invariant()
        def listed(self) -> None:
            assert set(self.acked) <= set(os.listdir(self.fs.root))

        def observe(self) -> list[str]:
            return self.present

        def expected(self, acked: list[Any]) -> list[str]:
            return sorted(set(acked))

    assert not hasattr(Keys, "use_profile") or Keys.use_profile is None  # one profile: no draw
    run_state_machine_as_test(Keys, settings=FAST)


def test_configuration_errors_are_refused_at_class_definition() -> None:
    with pytest.raises(ConfigError, match="unknown profile 'zfs'"):

        class BadProfile(RegisterMachine):
            profiles = ("zfs",)

    with pytest.raises(ConfigError, match="unknown crash mode"):

        class BadMode(RegisterMachine):
            modes = ("meteor",)

    with pytest.raises(ConfigError, match="may not be called 'crash'"):
        rule(crash=st.none())


def test_crash_prints_as_code() -> None:
    assert repr(Crash(at=3, mode="power")) == "Crash(at=3, mode='power')"
    assert repr(Crash(3, "torn", image=2, recovery_at=5)) == (
        "Crash(at=3, mode='torn', image=2, recovery_at=5)"
    )


class Diary:
    """Appends entries durably; its finalizer leaves a note, as stores that save on close do."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.dirty = False

    def add(self) -> None:
        fd = os.open(os.path.join(self.directory, "diary"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.write(fd, b"x")
        os.fsync(fd)
        os.close(fd)
        self.dirty = True

    def __del__(self) -> None:
        if self.dirty:
            with open(os.path.join(self.directory, NOTE), "w"):
                pass


NOTE = "closed-by-finalizer"


class DiaryMachine(CrashStateMachine):
    profiles = ("posix",)
    crash_recovery = False

    def recover(self) -> None:
        self.diary = Diary(self.fs.root)  # frees the crashed run's Diary (dbm.dumb-like)

    @rule()
    def add(self) -> None:
        self.diary.add()

    def observe(self) -> list[str]:
        return sorted(os.listdir(self.fs.root))

    def expected(self, acked: list[Any]) -> list[str]:
        return ["diary"]


def test_a_crashed_runs_finalizers_write_nothing_into_the_recovered_disk() -> None:
    unraisable: list[Any] = []
    previous, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        state = DiaryMachine()
        state.add(crash=None)
        # A kill -9 right after a step, then one inside it: each recover() replaces the
        # dead run's Diary, whose finalizer must meet the dead process, not the new image.
        state.add(crash=Crash(at=64, mode="process"))
        state.add(crash=Crash(at=2, mode="process"))
        state.add(crash=None)
        # The end of the example is a clean exit: the last Diary is finalized on its own
        # disk, not on the real one (where the machine's root does not exist).
        last = state.fs
        state.teardown()
        with last:
            assert NOTE in os.listdir(last.root)
        del state
    finally:
        sys.unraisablehook = previous
    assert unraisable == [], [u.exc_value for u in unraisable]
    assert not os.path.exists(DiaryMachine.root)


class Journal:
    """Appends lines to a file object it keeps open and acknowledges before flushing."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "journal")
        try:
            with open(self.path) as handle:
                self.lines = handle.read().splitlines()
        except FileNotFoundError:
            self.lines = []
        self.handle = open(self.path, "a")  # kept open, as a logger does

    def add(self, value: int) -> None:
        self.handle.write(f"{value}\n")  # no flush: the data sits in the buffer
        self.lines.append(str(value))


class JournalMachine(CrashStateMachine):
    profiles = ("posix",)
    modes = ("process",)

    def recover(self) -> None:
        self.journal = Journal(self.fs.root)

    @rule(value=st.integers(1, 9))
    def add(self, value: int) -> None:
        with self.acknowledging(value):
            self.journal.add(value)

    def observe(self) -> list[str]:
        return self.journal.lines

    def expected(self, acked: list[Any]) -> list[str]:
        return [str(value) for value in acked]


def test_an_acknowledgement_before_the_flush_is_named_as_such() -> None:
    # The machine said "a crash right after the create ... make the update atomic";
    # explore already named the missing flush.
    with pytest.raises(RecoveryCheckFailed) as caught:
        run_state_machine_as_test(JournalMachine, settings=FAST)
    cause = str(caught.value).split("cause: ", 1)[1]
    assert "still in the process's buffer" in cause, cause
    assert "flush()" in cause and "atomic" not in cause, cause
