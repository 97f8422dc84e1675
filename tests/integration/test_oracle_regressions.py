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
