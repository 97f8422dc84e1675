"""The start summary: used when it holds, never a wrong state when it does not.

A workload (children, a request, messages to the user) stops cleanly, so the
summary (``checkpoints/start.json``, :mod:`substrat.start_summary`) holds every
agent. Then:

* a restart takes every agent from it (no record read, no log opened) and
  gives exactly the state reading without it gives (the store removed);
* the summary torn, a byte of it flipped, deleted, or stale (the store
  rewritten since): not used, the report says why, the state is the same;
* a start retires it before its first write, so a crash after that leaves
  none: what it wrote (a record, a pending entry) is read, as without a
  summary; a checkpoint of every log while the root is open writes none;
* a log appended to under it (by hand, or a turn whose start's retirement
  is undone here by putting the summary back): that agent's entry is passed
  over (reported), the state is what the disk says (the turn counted);
* a pending entry put by hand beside a log under it is set aside at the
  agent's first use, never replayed; a record edited by hand under it is not
  looked at (the summary is the authority of a clean stop);
* ``fsck`` reports a damaged summary and ``--repair`` builds it again.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from oracle.harness import CrashHarness
from oracle.kill import abandon, exit_without_close
from oracle.sweep import SUMMARY_CHECKPOINTS
from oracle.workload import Step
from substrat import fsck, fsck_repair, start_summary
from substrat.checkpointer import CheckpointPolicy
from substrat.checkpoints import CHECKPOINTS_DIR, encode_store, read_store, store_path
from substrat.client import DaemonProcess
from substrat.eventlog import PAST_THE_SUMMARY, PENDING_NAME, encode_entry, read_log
from substrat.orchestrator import Orchestrator
from substrat.session import SessionStore
from tests.integration.test_checkpoints import agent_dirs, snapshot
from tests.support.cli import as_json
from tests.support.cli import run as cli
from tests.support.roots import three_roots

T = TypeVar("T")
POLICY = CheckpointPolicy(every_entries=4)
"""Checkpoints every few entries, no segment sealed: every agent can be in the summary."""


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def _workload(root: Path) -> None:
    orch = await Orchestrator.open(root, checkpoints=POLICY, slots=1)
    await orch.create_root("lead", "You coordinate.")
    await orch.run_turn("lead", "@spawn a worker\n@spawn b worker")
    await orch.run_turn("lead", "@ask a question\n@send b note")
    await orch.run_pending()
    await orch.run_turn("lead/a", "@send user hello")
    await orch.close()


def build_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    run(_workload(root))
    assert Path(start_summary.summary_path(root)).exists()
    return root


def reopen(root: Path) -> tuple[dict[str, Any], Any, Orchestrator]:
    async def go() -> tuple[dict[str, Any], Any, Orchestrator]:
        orch = await Orchestrator.open(root, checkpoints=POLICY)
        snap, report = snapshot(orch), orch.recovery_report
        exit_without_close(orch)  # no clean shutdown: it would write a new summary
        return snap, report, orch

    return run(go())


def a_turn_then_a_crash(root: Path) -> None:
    """One more turn of lead's after the clean stop, then a kill before any checkpoint or
    summary (the store stays the one the summary was written for)."""

    async def go() -> None:
        orch = await Orchestrator.open(root, checkpoints=CheckpointPolicy.off(), slots=1)
        await orch.run_turn("lead", "one more turn")
        abandon(orch)

    run(go())


async def checkpoint_then_crash(root: Path) -> None:
    """``Orchestrator.checkpoint()`` of every log, the logs still open, then a kill: the
    pending copies (already logged) stay beside their logs, and the summary knows them."""
    orch = await Orchestrator.open(root, checkpoints=POLICY, slots=1)
    await orch.create_root("lead", "You coordinate.")
    await orch.run_turn("lead", "@spawn a worker\n@send a note")
    await orch.run_pending()
    await orch.checkpoint()
    abandon(orch)


def without_checkpoints(root: Path, tmp_path: Path) -> dict[str, Any]:
    """The state the disk gives with no checkpoint store and no summary."""
    copy = tmp_path / "plain"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(root, copy)
    shutil.rmtree(copy / CHECKPOINTS_DIR)
    snap, report, _ = reopen(copy)
    assert report.checkpoints_used == 0 and report.summary_used == 0
    return snap


def _agents(root: Path) -> int:
    return len(SessionStore(root).list_dirs()[0])


def test_a_clean_restart_takes_every_agent_from_the_summary(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    want = without_checkpoints(root, tmp_path)
    snap, report, _ = reopen(root)
    assert report.start_summary is None
    assert report.summary_used == _agents(root) == 3
    assert report.summary_passed_over == [] and report.events_read == 0
    assert snap == want


def test_a_checkpoint_of_every_log_while_open_writes_no_summary(tmp_path: Path) -> None:
    """``Orchestrator.checkpoint()`` of every log, the logs still open, then a crash: no
    summary (the orchestrator writes on after it); the start reads the store."""
    root = tmp_path / "root"
    run(checkpoint_then_crash(root))
    assert all((d / PENDING_NAME).exists() for d in agent_dirs(root).values())
    assert not Path(start_summary.summary_path(root)).exists()
    want = without_checkpoints(root, tmp_path)
    snap, report, _ = reopen(root)
    assert report.start_summary is None and report.summary_used == 0
    assert report.checkpoints_used > 0  # the store's lines are read
    assert snap == want


def test_a_start_retires_the_summary_before_its_first_write(tmp_path: Path) -> None:
    """Opened from the summary, a record written (model changed), then a crash: the
    summary is gone, so the next start reads the record, not the summary's copy."""
    root = build_root(tmp_path)
    path = Path(start_summary.summary_path(root))
    a = agent_dirs(root)["a"].name

    async def go() -> None:
        orch = await Orchestrator.open(root, checkpoints=POLICY)
        assert orch.recovery_report is not None and orch.recovery_report.summary_used == 3
        assert not path.exists()  # retired before the open wrote anything
        record = orch.store.load(a)
        record.model = "written-after-the-start"
        orch.store.save(record)
        abandon(orch)

    run(go())
    assert not path.exists()
    snap, report, orch = reopen(root)
    assert report.start_summary is None and report.summary_used == 0
    assert orch.sessions[a].model == "written-after-the-start"
    assert snap == without_checkpoints(root, tmp_path)


def test_a_torn_damaged_deleted_or_stale_summary_is_not_used(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    want = without_checkpoints(root, tmp_path)
    path = Path(start_summary.summary_path(root))
    good = path.read_bytes()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x01
    damages = {
        "torn": (good[: len(good) - 10], "torn"),
        "byte": (bytes(flipped), "damaged"),
        "header": (b"x\n" + good, "no header"),
        # a header whose checksum holds for an empty body: the body has no first line
        "no newline": (b"0 0", "not JSON"),
        "no body": (b"0 0\n", "not JSON"),
    }
    for name, (data, said) in damages.items():
        path.write_bytes(data)
        snap, report, _ = reopen(root)
        assert said in str(report.start_summary), (name, report.start_summary)
        assert report.summary_used == 0 and report.checkpoints_used == 4, name
        assert snap == want, name
    path.write_bytes(good)
    store = read_store(root)
    # the same checkpoints written again: the store is another file now
    store_path(root).write_bytes(
        encode_store([c.held() for items in store.checkpoints.values() for c in items])
    )
    snap, report, _ = reopen(root)
    assert start_summary.STALE in str(report.start_summary)
    assert report.summary_used == 0 and report.checkpoints_used == 4
    assert snap == want
    assert not path.exists()  # each start retired the one it found, damaged or stale
    snap, report, _ = reopen(root)
    assert report.start_summary is None and report.summary_used == 0
    assert snap == want


def test_a_log_grown_after_the_summary_is_read_not_taken_from_it(tmp_path: Path) -> None:
    """A turn after the clean stop, then a crash before any checkpoint: the store is the
    one the summary was written for, but lead's log is longer."""
    root = build_root(tmp_path)
    lead = agent_dirs(root)["lead"].name
    path = Path(start_summary.summary_path(root))
    kept = path.read_bytes()
    before, _, _ = reopen(root)
    assert not path.exists()  # retired by that start

    a_turn_then_a_crash(root)
    # the unsynced pending copy of its last entry lost to a power loss (the appends were
    # fsynced), and the summary put back (a log appended to under it, as by hand): only
    # the log's own fingerprint shows it grew
    (agent_dirs(root)["lead"] / PENDING_NAME).unlink()
    path.write_bytes(kept)
    want = without_checkpoints(root, tmp_path)
    snap, report, _ = reopen(root)
    assert report.start_summary is None
    assert lead in report.summary_passed_over
    assert snap == want
    assert snap["agents"]["lead"]["turns"] == before["agents"]["lead"]["turns"] + 1


def test_a_summary_built_over_a_tail_leaves_that_agent_out(tmp_path: Path) -> None:
    """Built again (as ``fsck --repair`` does) while a log holds entries past its newest
    checkpoint: that agent has no entry (its checkpoint would miss them)."""
    root = build_root(tmp_path)
    lead = agent_dirs(root)["lead"].name

    a_turn_then_a_crash(root)
    (agent_dirs(root)["lead"] / PENDING_NAME).unlink()  # as above: only the log's size shows
    assert start_summary.write(root)
    summary, _ = start_summary.load(root)
    assert summary is not None and lead not in summary.agents
    want = without_checkpoints(root, tmp_path)
    snap, report, _ = reopen(root)
    assert report.start_summary is None and report.summary_used == 2
    assert snap == want


def test_a_pending_entry_a_crash_left_after_the_start_is_replayed(tmp_path: Path) -> None:
    """A start (which retires the summary), then a crash after an append's pending copy
    was written, before the log's: no summary, the entry is replayed."""
    root = build_root(tmp_path)
    reopen(root)
    assert not Path(start_summary.summary_path(root)).exists()
    b = agent_dirs(root)["b"]
    last = dict(read_log(b / "events.jsonl").entries[-1])
    last.pop("crc", None)
    (b / PENDING_NAME).write_bytes(encode_entry({**last, "seq": last["seq"] + 1}))
    want = without_checkpoints(root, tmp_path)
    snap, report, _ = reopen(root)
    assert snap == want
    assert report.summary_used == 0
    assert report.log_repairs[b.name]["pending_replayed"] is True
    assert read_log(b / "events.jsonl").entries[-1]["seq"] == last["seq"] + 1


def test_a_pending_entry_put_by_hand_under_the_summary_is_never_replayed(
    tmp_path: Path,
) -> None:
    """No substrat process leaves one while a summary exists (a crash leaves none): an
    entry put beside a stopped root's log by hand is set aside at the agent's first
    use, and the log goes on from where the summary says it ends."""
    root = build_root(tmp_path)
    b = agent_dirs(root)["b"]
    want = without_checkpoints(root, tmp_path)
    last = dict(read_log(b / "events.jsonl").entries[-1])
    last.pop("crc", None)
    planted = {**last, "seq": last["seq"] + 1, "data": {"planted": True}}
    (b / PENDING_NAME).write_bytes(encode_entry(planted))

    async def go() -> tuple[dict[str, Any], Any]:
        orch = await Orchestrator.open(root, checkpoints=POLICY, slots=1)
        snap, report = snapshot(orch), orch.recovery_report
        await orch.run_turn("lead/b", "a turn of its own")
        opened = orch.logs._open[b.name].report
        await orch.close()
        return snap, (report, opened)

    snap, (report, opened) = run(go())
    assert report.summary_used == 3 and report.summary_passed_over == []
    assert snap == want  # the state the summary gave, not one with the planted entry
    assert opened.pending_discarded == PAST_THE_SUMMARY and not opened.pending_replayed
    entries = read_log(b / "events.jsonl").entries
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    assert all(e["data"] != {"planted": True} for e in entries)
    assert len(entries) > last["seq"]  # the turn went on from where the summary said


def test_a_logged_pending_copy_back_under_the_summary_is_dropped_at_first_use(
    tmp_path: Path,
) -> None:
    """A clean stop removes each pending copy without an fsync, then writes the summary:
    a power loss may bring a copy back beside it, holding an entry its log has. The start
    takes the agent from the summary; the log's first open finds the entry logged, drops
    it, and its close removes the file."""
    root = build_root(tmp_path)
    b = agent_dirs(root)["b"]
    last = read_log(b / "events.jsonl").entries[-1]
    (b / PENDING_NAME).write_bytes(encode_entry({k: v for k, v in last.items() if k != "crc"}))
    whole = (b / "events.jsonl").read_bytes()

    async def go() -> Any:
        orch = await Orchestrator.open(root, checkpoints=POLICY, slots=1)
        report = orch.recovery_report
        await orch.run_turn("lead/b", "a turn of its own")
        opened = orch.logs._open[b.name].report
        await orch.close()
        return report, opened

    report, opened = run(go())
    assert report.summary_used == 3
    assert opened.pending_discarded == "already_logged" and not opened.pending_replayed
    assert (b / "events.jsonl").read_bytes().startswith(whole)
    assert not (b / PENDING_NAME).exists()


def test_a_record_edited_by_hand_under_the_summary_is_not_looked_at(tmp_path: Path) -> None:
    """No substrat process writes a record while a summary exists: a start takes the
    summary's copy (and says nothing of it: fsck does, see below)."""
    root = build_root(tmp_path)
    a = agent_dirs(root)["a"].name
    store = SessionStore(root)
    record = store.load(a)
    model = record.model
    record.model = "edited-by-hand"
    store.save(record)  # atomic_write: a new file
    _, report, orch = reopen(root)
    assert report.summary_used == 3  # its log is as the summary says
    assert orch.sessions[a].model == model


def test_fsck_reports_a_damaged_summary_and_repair_builds_it_again(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    assert fsck.check(root).problems == []
    path = Path(start_summary.summary_path(root))
    path.write_bytes(path.read_bytes()[:-5])
    assert fsck.check(root).kinds().get("start_summary_unusable") == 1
    repaired = fsck.check(root, repair=True)
    assert all(f.repaired for f in repaired.problems), repaired.problems
    assert fsck.check(root).problems == []
    summary, why = start_summary.load(root)
    assert why is None and summary is not None and len(summary.agents) == 3


def test_fsck_repair_retires_the_summary_before_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record damaged in a stopped root: ``fsck --repair`` quarantines it, and is
    killed before its recovery. No summary is left (it would hold the record)."""
    root = build_root(tmp_path)
    a = agent_dirs(root)["a"]
    (a / "session.json").write_bytes(b"{not a record")

    def killed(*_: Any) -> Any:
        raise RuntimeError("killed before the repair's recovery")

    monkeypatch.setattr(fsck_repair, "_recover", killed)
    with pytest.raises(RuntimeError, match="killed"):
        fsck.check(root, repair=True)
    assert not (a / "session.json").exists()  # the repair wrote: quarantined it
    assert not Path(start_summary.summary_path(root)).exists()


def test_the_daemon_says_which_agents_came_from_the_summary_and_why_not(tmp_path: Path) -> None:
    # A stale summary is what a crash leaves (said in the recovery line only); a damaged one
    # is damage, and the daemon's log says what it cost and what to do.
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    asyncio.run(three_roots(root))
    log = root / "daemon.log"
    with DaemonProcess(root).start() as daemon:
        daemon.terminate()  # a clean stop writes the summary
    path = Path(start_summary.summary_path(root))
    assert path.exists()
    with DaemonProcess(root).start() as daemon:
        used = cli(root, "daemon", "status")
        daemon.terminate()
    recovery = [line for line in log.read_text().splitlines() if "recovery:" in line]
    assert "4 from the start summary" in recovery[-1], recovery[-1]
    assert used.returncode == 0 and "start summary" not in used.stdout
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with DaemonProcess(root).start() as daemon:
        # `daemon status` says it too (it said nothing: only the log did)
        status = cli(root, "daemon", "status")
        answer = as_json(cli(root, "daemon", "status", "--json"))
        daemon.terminate()
    said = " ".join(status.stdout.split())
    assert "start summary not used: " in said and "checksum does not match" in said, said
    assert "every agent was read without it. `substrat fsck --repair` rebuilds it" in said
    assert answer["start_summary_unused"]["damaged"] is True
    lines = log.read_text().splitlines()
    recovery = [line for line in lines if "recovery:" in line]
    assert "start summary not used" in recovery[-1] and "from the start" not in recovery[-1]
    (warning,) = [line for line in lines if "WARNING" in line and "start summary" in line]
    assert "checksum does not match" in warning and "fsck --repair" in warning


def test_a_start_retires_the_summary_durably_before_it_writes() -> None:
    """On a simulated disk: a clean stop writes the summary, the start retires it, a turn
    writes; a power loss then (whatever was not fsynced lost) finds no summary."""
    harness = CrashHarness(checkpoints=SUMMARY_CHECKPOINTS)
    try:
        for step in (Step("create_root", "ada"), Step("spawn", "ada", "bob"), Step("checkpoint")):
            harness.run(step)
        path = start_summary.summary_path(harness.root)
        harness.run(Step("stop"))  # a clean stop writes it, the start takes both from it
        assert harness.orch.recovery_report is not None
        assert harness.orch.recovery_report.summary_used == 2  # ada and bob
        harness.run(Step("turn", "ada/bob"))
        image = harness.fs.crash_image("power")
        with image:
            assert not os.path.exists(path)
    finally:
        harness.close()
