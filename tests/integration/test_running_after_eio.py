"""The running orchestrator after an operation refused by EIO (oracle.refused).

An operation reported failed must not be visible as done in the running state,
and nothing acknowledged before it may disappear from it, though a restart
would show the right state again. The crash fuzzer checks that after its EIO
rules when it goes on without a crash; these tests pin the check on the two
planted bugs of oracle/mutant_eio.py (planted here by patching the running
orchestrator) and the targeted fsync that reaches them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from oracle.errors import OracleViolation
from oracle.faults import failing_fsync
from oracle.harness import CrashHarness
from oracle.refused import check_after_eio
from oracle.workload import Step
from substrat import events
from substrat.agents import USER, MessageEnvelope
from substrat.orchestrator import Orchestrator


@pytest.fixture
def harness() -> Iterator[CrashHarness]:
    harness = CrashHarness()
    harness.run(Step("create_root", "ada"))
    harness.run(Step("spawn", "ada", "bob"))
    yield harness
    harness.close()


def _user_log(harness: CrashHarness) -> str:
    return harness.orch.logs.path_text(USER)


def _log_of(harness: CrashHarness, path: str) -> str:
    return harness.orch.logs.path_text(harness.orch.tree.resolve(path).session_id)


def _ack_hiding_first(self: Orchestrator, message_ids: list[str]) -> list[str]:
    """``ack_user_messages`` with the mutant ``user_ack_hides_before_durable``."""
    inbox = self.inboxes.inbox(USER)
    present = [m for m in message_ids if m in inbox]
    if present:
        inbox.remove(present)  # planted: out of the running inbox before the entry is durable
        self.logs.get(USER).log(events.MESSAGE_DELIVERED, {"message_ids": present})
    return present


@pytest.mark.parametrize("written", [False, True])
def test_a_failed_acknowledge_keeps_the_users_messages_in_the_running_inbox(
    harness: CrashHarness, written: bool
) -> None:
    harness.run(Step("send", "ada", "user"))
    before = [m.message_id for m in harness.orch.user_inbox()]
    assert len(before) == 1
    outcome = harness.run_failing_fsyncs(
        Step("user_inbox"), 1, written=written, where=_user_log(harness)
    )
    assert outcome == "failed"
    check_after_eio(harness, outcome)  # the unmodified orchestrator shows them still
    assert [m.message_id for m in harness.orch.user_inbox()] == before
    harness.run(Step("user_inbox"))  # and goes on: the next acknowledge takes them
    harness.check_running()
    assert harness.orch.user_inbox() == []


def test_the_check_sees_messages_a_failed_acknowledge_hid(
    harness: CrashHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.run(Step("send", "ada", "user"))
    monkeypatch.setattr(Orchestrator, "ack_user_messages", _ack_hiding_first)
    outcome = harness.run_failing_fsyncs(Step("user_inbox"), 1, where=_user_log(harness))
    assert outcome == "failed"
    with pytest.raises(OracleViolation, match="gone from the running state") as caught:
        check_after_eio(harness, outcome)
    assert "inbox of user: lost messages" in str(caught.value)


@pytest.mark.parametrize("ask", [False, True])
def test_a_send_whose_commit_failed_reaches_no_running_inbox(
    harness: CrashHarness, ask: bool
) -> None:
    step = Step("ask" if ask else "send", "ada", "ada/bob")
    where = _log_of(harness, "ada")
    outcome = harness.run_failing_fsyncs(step, 1, where=where, entry="turn.complete")
    assert outcome == "done"  # the driver took the turn's failure (the model has it failed)
    assert harness.model.trace[-1].status.startswith("failed"), harness.model.trace[-1]
    check_after_eio(harness, outcome)
    bob = harness.orch.tree.resolve("ada/bob").agent_id
    assert harness.orch.inboxes.inbox(bob).all() == []


def test_the_check_sees_a_failed_sends_message_in_the_running_inbox(
    harness: CrashHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutant ``failed_turn_messages_delivered``, planted where a failed turn is
    reported: its staged messages handed to the running inboxes anyway."""
    real = Orchestrator.emit

    def emit(self: Orchestrator, kind: str, payload: dict[str, object]) -> None:
        if kind == "turn.failed":
            for data in staged:
                self.inboxes.deliver(MessageEnvelope.from_dict(data))
        real(self, kind, payload)

    staged: list[dict[str, object]] = []
    real_stage = Orchestrator._stage_commit

    def stage(self: Orchestrator, node: object, effects: object, response: str) -> object:
        staged.extend(effects.messages)  # type: ignore[attr-defined]
        return real_stage(self, node, effects, response)  # type: ignore[arg-type]

    monkeypatch.setattr(Orchestrator, "emit", emit)
    monkeypatch.setattr(Orchestrator, "_stage_commit", stage)
    outcome = harness.run_failing_fsyncs(
        Step("send", "ada", "ada/bob"), 1, where=_log_of(harness, "ada"), entry="turn.complete"
    )
    assert outcome == "done" and staged
    with pytest.raises(OracleViolation, match="shown as done though never acknowledged"):
        check_after_eio(harness, outcome)


def test_where_counts_only_that_files_fsyncs_and_fails_the_next_ones_of_any(
    harness: CrashHarness,
) -> None:
    """``failing_fsync(where=...)``: the nth fsync of that file fails, then the next
    ``count - 1`` fsyncs of any file (a take-back's, a reopen's)."""
    failed: list[str] = []
    log = _log_of(harness, "ada/bob")
    with harness.fs:
        real = os.fsync

        def spy(fd: int) -> None:
            try:
                real(fd)
            except OSError:
                failed.append(harness.fs.fd_path(fd))
                raise

        os.fsync = spy
        try:
            with failing_fsync(harness.fs, 2, where=log) as calls:
                harness.loop.run_until_complete(harness.driver.perform(Step("turn", "ada")))
                assert failed == [] and calls == [0]  # ada's log only: bob's never fsynced
                harness.loop.run_until_complete(harness.driver.perform(Step("turn", "ada/bob")))
        finally:
            os.fsync = real
    assert failed == [log], failed  # its second: the turn's commit
    assert calls[0] > 2  # counted on from it: the take-back's fsyncs came after


def test_entry_counts_only_the_fsyncs_of_that_events_appends(harness: CrashHarness) -> None:
    """With ``entry``, the fsync that fails is the one of that event's append (bob's
    ``@inbox`` turn restores its session, starts, then commits: the third append)."""
    harness.run(Step("evict", "ada/bob"))  # so its next turn restores the session first
    harness.run(Step("send", "ada", "ada/bob"))
    log = _log_of(harness, "ada/bob")
    outcome = harness.run_failing_fsyncs(
        Step("inbox", "ada/bob"), 1, where=log, entry="turn.complete"
    )
    assert outcome == "done"
    assert harness.model.trace[-1].status.startswith("failed"), harness.model.trace[-1]
    # bob's log: session.created, agent.created, message.enqueued, session.restored,
    # turn.start, then turn.complete, the sixth (and the first two fsyncs were not failed)
    assert "append of entry 6 " in harness.model.trace[-1].status
    check_after_eio(harness, outcome)  # the message it read is still in its inbox
    bob = harness.orch.tree.resolve("ada/bob").agent_id
    assert len(harness.orch.inboxes.inbox(bob).all()) == 1
