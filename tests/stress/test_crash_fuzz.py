"""The crash-recovery fuzzer (oracle.machines) on each faultfs profile."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis.stateful import precondition, rule

from oracle.machines import CrashPlan, CrashRecoveryMachine, maybe_crash
from oracle.shards import run_shard
from oracle.sweep import DELETING_CHECKPOINTS, SMALL_CHECKPOINTS, SUMMARY_CHECKPOINTS
from oracle.workload import Step
from substrat.providers.registry import ProviderRegistry
from tests.support.chat_server import ChatServer
from tests.support.directive_chat import directive_responder, openai_registry

pytestmark = pytest.mark.stress

OPENAI_SHARDS = 10
"""Items the OpenAI machine's examples are shared by (oracle.shards): over real
HTTP an example costs several times a scripted one, and as one item it was a
third of the ci campaign's CPU time, which bounds ``pytest -n 64`` (in six items,
3.6-6.0 CPU s each under ``ci``)."""


class Ext4CrashRecoveryMachine(CrashRecoveryMachine):
    profile = "ext4-ordered"


class LazyFSCrashRecoveryMachine(CrashRecoveryMachine):
    profile = "lazyfs"


class CheckpointCrashMachine(CrashRecoveryMachine):
    """Small checkpoint thresholds: logs checkpoint every few entries, active files are
    sealed into segments and archived, so crashes land inside all of it."""

    checkpoints = SMALL_CHECKPOINTS


class Ext4CheckpointCrashMachine(CheckpointCrashMachine):
    profile = "ext4-ordered"


class LazyFSCheckpointCrashMachine(CheckpointCrashMachine):
    profile = "lazyfs"


class DeletingCrashMachine(CrashRecoveryMachine):
    """The same under the ``delete`` compaction policy: first segments are deleted once a
    durable checkpoint covers them (their base written first), so crashes land between
    the base and the removals, and the oracle checks every deleted range is covered."""

    checkpoints = DELETING_CHECKPOINTS


class Ext4DeletingCrashMachine(DeletingCrashMachine):
    profile = "ext4-ordered"


class LazyFSDeletingCrashMachine(DeletingCrashMachine):
    profile = "lazyfs"


class SummaryCrashMachine(CrashRecoveryMachine):
    """Checkpoints only when a rule asks (or an eviction), nothing sealed, and clean
    restarts: a clean stop writes a start summary that holds every agent checkpointed to
    its end (substrat.start_summary), the start takes them from it and retires it before
    its first write, so crashes land inside its write, its retirement and everything
    after it."""

    checkpoints = SUMMARY_CHECKPOINTS

    @precondition(lambda self: self._has_agents())
    @rule(crash=maybe_crash)
    def clean_restart(self, crash: CrashPlan | None) -> None:
        self._step(Step("stop"), crash)


SCRIPTED_SHARDS = 2
"""Items each scripted machine's examples are shared by: one item each cost 3.8-4.7 CPU s
under ``ci``, above 1/64 of the campaign. Each shard has its own seed under ``ci``
(oracle.shards.shard_seed), so the eighteen items draw eighteen different example sets."""

SCRIPTED = {
    "posix": CrashRecoveryMachine,
    "ext4": Ext4CrashRecoveryMachine,
    "lazyfs": LazyFSCrashRecoveryMachine,
    "checkpoints-posix": CheckpointCrashMachine,
    "checkpoints-ext4": Ext4CheckpointCrashMachine,
    "checkpoints-lazyfs": LazyFSCheckpointCrashMachine,
    "deleting-posix": DeletingCrashMachine,
    "deleting-ext4": Ext4DeletingCrashMachine,
    "deleting-lazyfs": LazyFSDeletingCrashMachine,
    "summary-posix": SummaryCrashMachine,
}


@pytest.mark.parametrize("shard", range(SCRIPTED_SHARDS))
@pytest.mark.parametrize("machine", SCRIPTED)
def test_crash_recovery(machine: str, shard: int) -> None:
    run_shard(SCRIPTED[machine], shard, SCRIPTED_SHARDS)


class OpenAICrashRecoveryMachine(CrashRecoveryMachine):
    """The same fuzzer with every agent on the openai provider, over real loopback HTTP.

    The endpoint turns directive lines into real tool-call rounds; the oracle
    compares every recovered conversation with the acknowledged transcripts,
    message for message, and checks it is one the endpoint accepts.
    """

    provider = "openai"
    server: ChatServer | None = None

    def make_registry(self) -> ProviderRegistry:
        assert self.server is not None, "the module fixture starts the server"
        return openai_registry(self.server)

    def teardown(self) -> None:
        super().teardown()
        server = type(self).server
        assert server is not None
        rejected = server.rejected()
        assert not rejected, f"the endpoint rejected a conversation: {rejected[0]}"


@pytest.fixture(scope="module")
def chat_server() -> Iterator[ChatServer]:
    with ChatServer(directive_responder) as server:
        OpenAICrashRecoveryMachine.server = server
        yield server
    OpenAICrashRecoveryMachine.server = None


@pytest.mark.parametrize("shard", range(OPENAI_SHARDS))
def test_crash_recovery_openai(chat_server: ChatServer, shard: int) -> None:
    run_shard(OpenAICrashRecoveryMachine, shard, OPENAI_SHARDS)
