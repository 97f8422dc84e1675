"""Bugs the crash fuzzer found, pinned as deterministic reproductions."""

from __future__ import annotations

from oracle.harness import CrashHarness
from oracle.workload import Step


def test_terminated_child_is_not_resurrected_by_the_spawn_roll_forward() -> None:
    harness = CrashHarness()
    harness.run(Step("create_root", "ada"))
    harness.run(Step("spawn", "ada", "ada"))
    harness.run(Step("terminate", "ada/ada"))
    harness.run(Step("broadcast", "ada"), crash_at=1)
    harness.crash_and_recover("process")  # raises OracleViolation if the child came back
    assert [a.name for a in harness.model.state.agents.values()] == ["ada"]
    harness.close()


def test_user_log_is_repaired_and_its_pending_entry_replayed_at_recovery() -> None:
    harness = CrashHarness(profile="ext4-ordered")
    harness.run(Step("create_root", "ada"))
    harness.run(Step("send", "ada", "user"))
    harness.run(Step("create_root", "bob"))
    # crash right after the delivery entry reached the pending file
    harness.run(Step("user_inbox"), crash_at=2)
    harness.crash_and_recover("process")
    harness.run(Step("send", "ada", "user"))
    harness.run(Step("create_root", "cy"), crash_at=1)
    harness.crash_and_recover("process")
    harness.run(Step("user_inbox"), crash_at=6)
    harness.crash_and_recover("torn")
    harness.close()


def test_a_message_of_an_unknown_kind_costs_that_message_not_the_recovery(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A valid, checksummed entry from a newer version with a message kind this one
    does not know is skipped and reported; every other message still comes back."""
    import asyncio

    from substrat.eventlog import EventLog
    from substrat.orchestrator import Orchestrator

    async def scenario() -> None:
        orch = await Orchestrator.open(tmp_path)
        info = await orch.create_root("ada")
        await orch.run_turn("ada", "@send user kept")
        await orch.close()
        with EventLog(orch.logs.path(info.session_id), {"session_id": info.session_id}) as log:
            log.log(
                "message.enqueued",
                {
                    "message_id": "f" * 32,
                    "sender": "user",
                    "recipient": info.agent_id,
                    "kind": "telepathy",
                    "payload": "from the future",
                    "timestamp": "2030-01-01T00:00:00+00:00",
                    "reply_to": None,
                    "metadata": {},
                },
            )
        again = await Orchestrator.open(tmp_path)
        report = again.recovery_report
        assert report is not None
        assert report.log_damage[info.session_id] == {"unreadable_message": 1}
        assert [m.payload for m in again.user_inbox()] == ["kept"]
        assert again.inboxes.inbox(info.agent_id).all() == []
        await again.close()

    asyncio.run(scenario())
