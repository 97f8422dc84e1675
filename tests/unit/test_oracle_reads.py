"""One check's reads (oracle.reads): the agents directory read once, log facts kept by read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import oracle.reads
from oracle.errors import OracleViolation
from oracle.harness import CrashHarness
from oracle.incremental import files_below
from oracle.reads import Reads
from oracle.workload import Step


def _recovered() -> CrashHarness:
    """A root with a child, both with turns, just crashed and recovered."""
    harness = CrashHarness()
    harness.run(Step("create_root", "ada"))
    harness.run(Step("spawn", "ada", "bob"))
    harness.run(Step("turn", "ada"))
    harness.run(Step("turn", "ada/bob"))
    harness.run(Step("turn", "ada"), crash_at=10_000)  # no boundary that far: crash after
    harness.crash_and_recover("power")
    return harness


def test_a_check_reads_the_agents_directory_once_and_cuts_each_session_from_it() -> None:
    """Each session's directory, as a check's reads give it, is what ``files_below``
    reads of it alone (a missing one too), and the check touched the disk once for
    the agents directory and all of them."""
    harness = _recovered()
    fs, orch = harness.fs, harness.orch
    dirs = [os.path.dirname(orch.logs.path(n.session_id)) for n in orch.tree.walk()]
    assert len(dirs) == 2
    missing = os.path.join(os.fspath(orch.store.agents_dir), "f" * 32)
    reads = Reads(orch, harness.memos, fs)
    touches = fs.touches
    cut = {d: reads.files(d) for d in [*dirs, missing]}
    reads.scan()
    assert fs.touches == touches + 1  # one read_tree of agents/ for all of them
    for directory, files in cut.items():
        assert files == files_below(fs, directory), directory
    assert cut[missing] == {}
    assert all("events.jsonl" in cut[d] for d in dirs)
    harness.close()


def test_a_file_where_a_session_directory_would_be_reads_as_files_below_says() -> None:
    harness = _recovered()
    fs, orch = harness.fs, harness.orch
    stray = os.path.join(os.fspath(orch.store.agents_dir), "e" * 32)
    with fs:
        Path(stray).write_bytes(b"not a directory\n")
    reads = Reads(orch, harness.memos, fs)
    assert reads.files(stray) == files_below(fs, stray) == {"": b"not a directory\n"}
    harness.close()


def test_the_invariants_derive_a_logs_facts_again_only_for_a_new_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kept while the memos hand back the same read of a log; a log that changed (a
    message sent) is derived again, and a pending message that its log does not
    define is still found."""
    from oracle.checks import check_invariants

    derived: list[int] = []
    derive = oracle.reads.derive_log_facts

    def counted(read: object, base: object) -> object:
        derived.append(1)
        return derive(read, base)  # type: ignore[arg-type]

    monkeypatch.setattr(oracle.reads, "derive_log_facts", counted)
    harness = _recovered()

    def check() -> None:
        orch, fs = harness.orch, harness.fs
        with fs:
            check_invariants(orch, harness.model.state, Reads(orch, harness.memos, fs))

    check()
    first = len(derived)
    check()
    assert len(derived) == first  # the same reads: nothing derived again
    harness.run(Step("send", "ada", "ada/bob"), crash_at=10_000)
    harness.crash_and_recover("power")  # the check after recovery: the changed logs' facts
    assert len(derived) > first
    again = len(derived)
    check()
    assert len(derived) == again
    orch = harness.orch
    bob = next(n for n in orch.tree.walk() if n.name == "bob")
    log = Path(orch.logs.path(bob.session_id))
    with harness.fs:  # the message's enqueue cut off behind the orchestrator: the inbox holds it
        lines = log.read_bytes().splitlines(keepends=True)
        cut = max(i for i, line in enumerate(lines) if b'"message.enqueued"' in line)
        log.write_bytes(b"".join(lines[:cut] + lines[cut + 1 :]))
    with pytest.raises(OracleViolation, match="not enqueued minus delivered"):
        check()
    harness.close()
