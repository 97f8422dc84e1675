"""CrashStateMachine's profile draw keeps the first recover()'s writes as unsynced as they were.

The store here creates its file when it is opened and never fsyncs the
directory (TinyDB's ``touch`` and ``dbm.dumb`` do the same): under posix a
power cut after an acknowledged, fsynced append loses the file's name. Only
setup()'s files are durable before the first step, whichever profile is drawn.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import seed
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from faultfs.errors import RecoveryCheckFailed
from faultfs.stateful import CrashStateMachine, initialize, rule
from tests.support.faultfs_classic import fsync_dir, machine_settings

RUN = machine_settings(200)


class LineStore:
    """Lines in one file, created on open; ``dir_sync`` fsyncs the directory after the create."""

    def __init__(self, root: str, dir_sync: bool) -> None:
        self.path = os.path.join(root, "data")
        if not os.path.exists(self.path):
            open(self.path, "ab").close()
            if dir_sync:
                fsync_dir(root)
        with open(self.path, "rb") as handle:
            self.items = [line for line in handle.read().split(b"\n") if line]

    def add(self, item: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        os.write(fd, item + b"\n")
        os.fsync(fd)
        os.close(fd)
        self.items.append(item)


class CreateOnOpen(CrashStateMachine):
    modes = ("power",)  # profiles: the default three
    dir_sync = False

    def recover(self) -> None:
        self.store = LineStore(self.fs.root, self.dir_sync)

    @rule(item=st.sampled_from([b"a", b"b"]))
    def add(self, item: bytes) -> None:
        with self.acknowledging(item):
            self.store.add(item)

    def observe(self) -> list[bytes]:
        return self.store.items

    def expected(self, acked: list[Any]) -> list[bytes]:
        return list(acked)


class CreateOnOpenSynced(CreateOnOpen):
    dir_sync = True


def test_after_the_draw_the_first_recovers_create_is_visible_but_not_durable() -> None:
    state = CreateOnOpen()
    state.use_profile(profile="ext4-ordered")
    assert state.fs.profile == "ext4-ordered"
    assert state.fs.tree() == {"data": b""}
    assert state.fs.tree(durable=True) == {}


@pytest.mark.parametrize("run_seed", [1, 2, 3])
def test_a_create_never_made_durable_fails_under_the_default_profiles(run_seed: int) -> None:
    assert CreateOnOpen.profiles == ("posix", "ext4-ordered", "lazyfs")  # the defaults
    machine = seed(run_seed)(type(f"CreateOnOpen{run_seed}", (CreateOnOpen,), {}))
    with pytest.raises(RecoveryCheckFailed) as caught:
        run_state_machine_as_test(machine, settings=RUN)
    message = str(caught.value)
    assert "(profile posix," in message
    assert "cause: the entry data created at" in message
    assert "was never made durable before it was acknowledged" in message


def test_the_same_store_with_the_directory_fsync_passes_every_profile() -> None:
    run_state_machine_as_test(CreateOnOpenSynced, settings=RUN)


def test_the_users_initialize_rules_run_after_the_profile_draw() -> None:
    # Before the draw the disk is always the first profile's (posix); an initialize
    # rule run first would also make the draw refuse the changed disk (ConfigError).
    seen: set[str] = set()

    class WithInitialize(CreateOnOpenSynced):
        @initialize(item=st.just(b"z"))
        def first_item(self, item: bytes) -> None:
            seen.add(self.fs.profile)
            with self.acknowledging(item):
                self.store.add(item)

    run_state_machine_as_test(WithInitialize, settings=machine_settings(20, derandomize=True))
    assert seen == {"posix", "ext4-ordered", "lazyfs"}
