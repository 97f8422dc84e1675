"""Checkpoints: a restart reads only what follows them, and a bad one never makes it wrong.

A workload (children, requests and replies, the user's inbox, evictions, a
termination, a turn cut by a kill) runs with a small checkpoint policy, so
every agent's log has several checkpoints, sealed segments and archives. Then:

* reopening with the checkpoints gives exactly the state reopening without
  them gives (the store removed), and reads only the entries after them;
* a damaged checkpoint (the store's last line torn; a checkpoint ahead of its
  log, as when a log is restored from an older backup; one that does not
  match its log: another log's, or a log rewritten so its lines moved; the
  store deleted) is rejected and its log read from the start, the report says
  which and why, and the state is what the logs say, never the checkpoint's.
"""

from __future__ import annotations

import asyncio
import gzip
import shutil
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import orjson

from oracle.kill import exit_without_close
from substrat import compaction, events, fsck
from substrat.checkpointer import CheckpointPolicy
from substrat.checkpoints import (
    CHECKPOINTS_DIR,
    Checkpoint,
    encode_store,
    read_store,
    store_path,
)
from substrat.conversation import ConversationGone
from substrat.eventlog import read_log
from substrat.orchestrator import Orchestrator
from substrat.segments import list_sealed
from substrat.session.store import AGENTS_DIR

T = TypeVar("T")
SMALL = CheckpointPolicy(every_entries=4, segment_bytes=1500, compaction="archive")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def snapshot(orch: Orchestrator) -> dict[str, Any]:
    """Everything recovery rebuilds, by agent path."""
    agents = {}
    for node in orch.tree.walk():
        path = orch.tree.path(node.agent_id)
        agents[path] = {
            "state": node.state.value,
            "waiting_on": sorted(node.waiting_on),
            "inbox": sorted(m.message_id for m in orch.inboxes.inbox(node.agent_id).all()),
            "turns": orch.turn_counts.get(node.agent_id),
            "last_complete_seq": orch.last_complete_seq.get(node.agent_id),
            "lost_turn": node.lost_turn,
            "history": _history(orch, node.agent_id),
        }
    return {"agents": agents, "user": sorted(m.message_id for m in orch.user_inbox())}


def _history(orch: Orchestrator, agent_id: str) -> list[tuple[str, str, str]] | str:
    try:
        return [(t.turn_id, t.prompt, t.response) for t in orch.history(agent_id)]
    except ConversationGone:  # its first entries are gone with nothing saying what they held
        return "gone"


async def _workload(root: Path, rounds: int) -> None:
    orch = await Orchestrator.open(root, checkpoints=SMALL, slots=1)
    if not orch.tree.roots():
        await orch.create_root("lead", "You coordinate.")
        await orch.run_turn("lead", "@spawn a worker\n@spawn b worker\n@spawn c doomed")
    for i in range(rounds):
        await orch.run_turn("lead", f"@ask a question {i}\n@send b note {i}")
        await orch.run_pending()
        await orch.run_turn("lead/a", f"@complete result {i}\n@send user hello {i}")
        await orch.run_turn("lead/b", f"@ask lead what next {i}")
        if i == 1:
            orch.ack_user_messages([m.message_id for m in orch.user_inbox()][:1])
            await orch.run_turn("lead", "@terminate c")
    await orch.close()


def build_root(tmp_path: Path, rounds: int = 4) -> Path:
    root = tmp_path / "root"
    run(_workload(root, rounds))
    return root


def reopen(root: Path) -> tuple[dict[str, Any], Any]:
    async def go() -> tuple[dict[str, Any], Any]:
        orch = await Orchestrator.open(root, checkpoints=SMALL)
        snap, report = snapshot(orch), orch.recovery_report
        exit_without_close(orch)  # no clean shutdown: it would write new checkpoints
        return snap, report

    return run(go())


def from_the_logs(root: Path, tmp_path: Path) -> dict[str, Any]:
    """The state the logs alone give: the same disk, its checkpoint store removed."""
    copy = tmp_path / "logs-only"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(root, copy)
    shutil.rmtree(copy / CHECKPOINTS_DIR, ignore_errors=True)
    snap, report = reopen(copy)
    assert report.checkpoints_used == 0
    return snap


def agent_dirs(root: Path) -> dict[str, Path]:
    """Agent name -> its directory (from the logs, every segment read)."""
    out = {}
    for directory in (root / AGENTS_DIR).iterdir():
        for entry in read_log(directory / "events.jsonl").entries:
            if entry["event"] == events.AGENT_CREATED:
                out[entry["data"]["name"]] = directory
    return out


# -- checkpoints that hold ------------------------------------------------------------


def test_a_restart_reads_only_what_follows_the_checkpoints(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    store = read_store(root)
    assert len(store.checkpoints) >= 4  # lead, a, b and the user's log
    assert any(list_sealed(d / "events.jsonl") for d in (root / AGENTS_DIR).iterdir())
    snap, report = reopen(root)
    assert report.checkpoints_used >= 4
    assert report.checkpoints_rejected == {}
    assert report.read_in_full == []
    assert report.events_read == 0  # a clean shutdown checkpointed everything
    assert snap == from_the_logs(root, tmp_path)
    assert set(snap["agents"]) == {"lead", "lead/a", "lead/b"}


def test_a_crash_leaves_tails_that_recovery_reads_after_the_checkpoints(tmp_path: Path) -> None:
    root = build_root(tmp_path)

    async def more_then_kill() -> None:
        orch = await Orchestrator.open(root, checkpoints=SMALL, slots=1)
        await orch.run_turn("lead", "@ask a one more")
        await orch.run_pending()
        await orch.run_turn("lead/b", "@send user unread")
        exit_without_close(orch)  # killed: no clean shutdown, no closing checkpoints

    run(more_then_kill())
    snap, report = reopen(root)
    assert 0 < report.events_read < 60
    assert snap == from_the_logs(root, tmp_path)


# -- checkpoints that do not hold: each falls back to its log, with a report -----------


def _store_lines(root: Path) -> list[bytes]:
    return store_path(root).read_bytes().splitlines(keepends=True)


def _rewrite_store(root: Path, checkpoints: list[Checkpoint]) -> None:
    store_path(root).write_bytes(encode_store(checkpoints))


def _newest(root: Path) -> dict[str, Checkpoint]:
    return {e: items[-1] for e, items in read_store(root).checkpoints.items()}


def test_torn_checkpoint_falls_back_to_the_log(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    newest = _newest(root)
    victim = agent_dirs(root)["a"].name
    # one checkpoint per log, agent a's last: tearing the last line leaves a none
    _rewrite_store(root, [c for e, c in sorted(newest.items()) if e != victim] + [newest[victim]])
    data = store_path(root).read_bytes()
    store_path(root).write_bytes(data[: len(data) - 40])
    snap, report = reopen(root)
    assert report.log_damage[CHECKPOINTS_DIR] == {"torn_tail": 1}
    assert report.read_in_full == [victim]
    assert snap == from_the_logs(root, tmp_path)


def test_checkpoints_ahead_of_their_logs_are_rejected(tmp_path: Path) -> None:
    """The logs restored from an older backup, the newer checkpoint store kept: every
    checkpoint covers entries its log lacks."""
    root = build_root(tmp_path, rounds=2)
    backup = tmp_path / "backup"
    shutil.copytree(root, backup)
    run(_workload(root, 3))  # more turns, newer checkpoints
    newer_store = store_path(root).read_bytes()
    shutil.rmtree(root)
    shutil.copytree(backup, root)
    store_path(root).write_bytes(newer_store)
    # only the newest checkpoint of each log: no older one to fall back on
    _rewrite_store(root, [c for _, c in sorted(_newest(root).items())])
    snap, report = reopen(root)
    assert report.checkpoints_used == 0
    assert sorted(report.checkpoints_rejected) == sorted(report.read_in_full)
    assert len(report.read_in_full) >= 4
    for reason in report.checkpoints_rejected.values():
        assert "ends before" in reason or "not in the log" in reason, reason
    assert snap == from_the_logs(root, tmp_path)


def test_stale_store_still_holds_and_costs_only_a_longer_tail(tmp_path: Path) -> None:
    root = build_root(tmp_path, rounds=2)
    old_store = store_path(root).read_bytes()
    run(_workload(root, 3))
    store_path(root).write_bytes(old_store)  # the store from an older backup
    snap, report = reopen(root)
    assert report.checkpoints_rejected == {}
    assert report.checkpoints_used >= 4 and report.events_read > 0
    assert snap == from_the_logs(root, tmp_path)


def test_another_logs_checkpoint_is_rejected(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    newest = _newest(root)
    dirs = agent_dirs(root)
    a, b = dirs["a"].name, dirs["b"].name
    swapped = Checkpoint(a, newest[b].at, newest[b].facts)  # b's checkpoint, filed as a's
    _rewrite_store(root, [c for e, c in sorted(newest.items()) if e != a] + [swapped])
    snap, report = reopen(root)
    assert a in report.checkpoints_rejected, report.checkpoints_rejected
    # the others' checkpoints may count on what a's log holds: every log is read in full
    assert a in str(report.checkpoints_set_aside)
    assert report.checkpoints_used == 0 and a in report.read_in_full
    assert snap == from_the_logs(root, tmp_path)


def test_checkpoint_of_a_rewritten_log_is_rejected(tmp_path: Path) -> None:
    """A tool that rewrites a log (dropping a line) moves every later line."""
    root = build_root(tmp_path)
    victim = agent_dirs(root)["lead"]
    _rewrite_store(root, [c for _, c in sorted(_newest(root).items())])
    active = victim / "events.jsonl"
    lines = active.read_bytes().splitlines(keepends=True)
    assert len(lines) >= 2
    active.write_bytes(b"".join(lines[1:]))  # its first line gone: the others move up
    snap, report = reopen(root)
    assert victim.name in report.checkpoints_rejected
    assert victim.name in report.read_in_full
    assert snap == from_the_logs(root, tmp_path)


def _enqueued_lines(directory: Path) -> list[tuple[Path, int, int]]:
    """(file, offset, length) of every ``message.enqueued`` line in a log's files."""
    out = []
    for path in sorted(directory.glob("events*.jsonl")):
        offset = 0
        for line in path.read_bytes().splitlines(keepends=True):
            if b'"event":"message.enqueued"' in line:
                out.append((path, offset, len(line)))
            offset += len(line)
    return out


def test_a_message_a_damaged_log_lost_comes_back_from_its_senders_log(tmp_path: Path) -> None:
    """A sender's checkpoint forgets the messages its turns sent once their recipients
    logged them. When the recipient's line is then damaged, only the sender's log still
    says the message was sent: the restart must read it, as the logs alone would, and
    the message is delivered again rather than lost."""
    root = build_root(tmp_path)
    lead = agent_dirs(root)["lead"]
    path, offset, length = _enqueued_lines(lead)[-1]  # the newest message lead received
    data = bytearray(path.read_bytes())
    message_id = orjson.loads(data[offset : offset + length])["data"]["message_id"]
    data[offset + length // 2] ^= 0x01  # its CRC fails: the line is damage, not data
    path.write_bytes(bytes(data))
    want = from_the_logs(root, tmp_path)
    snap, report = reopen(root)
    assert snap == want
    assert f"message:{message_id}" in report.reconciled  # logged again, from a's turn
    assert report.checkpoints_set_aside is not None
    assert report.checkpoints_used == 0


def _message_after_lead_checkpoint(tmp_path: Path) -> tuple[Path, Path, int, int]:
    """A root where a's newest checkpoint forgot a message it sent lead, and lead's
    checkpoint that holds is older than the message's line: (root, file, offset, length)
    of that line, the last of lead's log."""
    root = build_root(tmp_path)

    async def one_more() -> None:
        orch = await Orchestrator.open(root, checkpoints=SMALL, slots=1)
        await orch.run_turn("lead/a", "@send lead one more")
        await orch.close()  # every log checkpointed to its end: a's forgets the message

    run(one_more())
    lead = agent_dirs(root)["lead"]
    path, offset, length = _enqueued_lines(lead)[-1]
    assert path.name == "events.jsonl" and offset + length == path.stat().st_size
    keep_a_checkpoint_before(root, lead.name, offset)
    return root, path, offset, length


def keep_a_checkpoint_before(root: Path, endpoint: str, offset: int) -> None:
    """Lose the endpoint's newest checkpoint (the store's own damage), so its older one,
    before ``offset`` of its active file, is what holds."""
    newest = _newest(root)
    older = [c for c in read_store(root).checkpoints[endpoint] if c.at.offset < offset]
    assert older, "the log has a checkpoint before that line"
    _rewrite_store(root, [c for e, c in sorted(newest.items()) if e != endpoint] + older[-1:])


def _flip(path: Path, offset: int, length: int) -> str:
    """Flip a byte in the middle of the line; returns the id of the message it held."""
    data = bytearray(path.read_bytes())
    message_id = str(orjson.loads(data[offset : offset + length])["data"]["message_id"])
    data[offset + length // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return message_id


def test_a_damaged_last_line_cut_off_a_log_comes_back_from_its_senders_log(
    tmp_path: Path,
) -> None:
    """A whole last line with a bad checksum is cut like a torn append, but it may have
    been acknowledged: when the sender's checkpoint forgot the message it held, the
    restart reads the sender's log and the message comes back."""
    root, path, offset, length = _message_after_lead_checkpoint(tmp_path)
    message_id = _flip(path, offset, length)
    want = from_the_logs(root, tmp_path)
    snap, report = reopen(root)
    assert snap == want
    assert f"message:{message_id}" in report.reconciled
    assert report.log_repairs[path.parent.name]["whole_lines_cut"] == 1
    assert "cut off the end" in str(report.checkpoints_set_aside)


def test_fsck_repair_of_a_damaged_line_keeps_the_message_its_sender_forgot(
    tmp_path: Path,
) -> None:
    """``fsck --repair`` quarantines a damaged line, or cuts a damaged last one: when
    the line held a message whose sender's checkpoint forgot it, the recovery that ends
    the repair must still bring it back from the sender's log."""
    root, path, offset, length = _message_after_lead_checkpoint(tmp_path)
    message_id = _flip(path, offset, length)
    want = from_the_logs(root, tmp_path)
    repaired = fsck.check(root, repair=True)
    assert repaired.recovery is not None
    assert f"message:{message_id}" in repaired.recovery["reconciled"]
    assert fsck.check(root).problems == []
    snap, _ = reopen(root)
    # the repair reserves one more turn id (the damaged line might have started a turn)
    for name, agent in want["agents"].items():
        assert snap["agents"][name].pop("turns") >= agent.pop("turns")
    assert snap == want


def test_deleted_store_reads_every_log_in_full(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    shutil.rmtree(root / CHECKPOINTS_DIR)
    snap, report = reopen(root)
    assert report.checkpoints_used == 0
    assert len(report.read_in_full) >= 4
    assert snap == from_the_logs(root, tmp_path)


def test_checkpoint_with_a_flipped_byte_is_damage_not_data(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    newest = _newest(root)
    victim = agent_dirs(root)["b"].name
    _rewrite_store(root, [c for e, c in sorted(newest.items()) if e != victim] + [newest[victim]])
    data = bytearray(store_path(root).read_bytes())
    data[-30] ^= 0x01  # inside the last checkpoint's facts: its line's CRC fails
    store_path(root).write_bytes(bytes(data))
    snap, report = reopen(root)
    assert report.log_damage[CHECKPOINTS_DIR] == {"bad_checksum": 1}
    assert report.read_in_full == [victim]
    assert snap == from_the_logs(root, tmp_path)


# -- fsck and compact ------------------------------------------------------------------


def test_fsck_is_clean_on_a_root_with_checkpoints_and_segments(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    report = fsck.check(root)
    assert report.problems == [], report.problems
    assert not [f for f in report.findings if f.kind == "unexpected_file"]


def test_fsck_repair_finishes_an_archive_a_crash_interrupted(tmp_path: Path) -> None:
    """A crash between writing a segment's archive and removing its plain copy leaves
    both: fsck reports it, and --repair removes the plain copy (the archive reads the
    same), and the state is unchanged."""
    root = build_root(tmp_path)
    before, _ = reopen(root)
    archived = [
        s for d in agent_dirs(root).values() for s in list_sealed(d / "events.jsonl") if s.archived
    ]
    assert archived, "the workload archives segments"
    twin = archived[0].path.with_name(archived[0].name.removesuffix(".gz"))
    twin.write_bytes(gzip.decompress(archived[0].path.read_bytes()))
    assert fsck.check(root).kinds().get("segment_archived_twice") == 1
    repaired = fsck.check(root, repair=True)
    assert all(f.repaired for f in repaired.problems), repaired.problems
    assert not twin.exists() and archived[0].path.exists()
    assert fsck.check(root).problems == []
    after, _ = reopen(root)
    assert after == before


def test_fsck_reports_a_checkpoint_that_disagrees_and_repair_rebuilds_it(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    victim = agent_dirs(root)["lead"]
    seg = list_sealed(victim / "events.jsonl")[0]
    # a byte flipped in an old line: the entry the checkpoint names is intact, the prefix
    # before it is not (only a full read, like fsck's, can tell)
    data = bytearray(
        gzip.decompress(seg.path.read_bytes()) if seg.archived else seg.path.read_bytes()
    )
    data[20] ^= 0x01
    seg.path.write_bytes(gzip.compress(bytes(data)) if seg.archived else bytes(data))
    found = fsck.check(root)
    kinds = found.kinds()
    assert kinds.get("checkpoint_mismatch") == 1 and kinds.get("damaged_line") == 1, kinds
    repaired = fsck.check(root, repair=True)
    assert all(f.repaired for f in repaired.problems), repaired.problems
    assert fsck.check(root).problems == []
    snap, report = reopen(root)
    assert report.checkpoints_rejected == {} and report.read_in_full == []
    assert snap == from_the_logs(root, tmp_path)


def test_compact_archives_what_checkpoints_cover_and_dry_run_changes_nothing(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"

    async def keep_everything() -> None:
        orch = await Orchestrator.open(root, checkpoints=CheckpointPolicy(segment_bytes=1500))
        await orch.create_root("lead", "You coordinate.")
        for i in range(12):
            await orch.run_turn("lead", f"turn {i} " + "x" * 200)
        await orch.close()

    run(keep_everything())
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    planned = compaction.plan(root)
    assert any(item.sealed for item in planned.logs)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    done = compaction.compact(root)
    assert done.archived >= 1 and done.bytes_after < done.bytes_before
    assert not any(
        s for s in list_sealed(agent_dirs(root)["lead"] / "events.jsonl") if not s.archived
    )
    snap, report = reopen(root)
    assert report.checkpoints_rejected == {} and report.events_read == 0
    assert len(snap["agents"]["lead"]["history"]) == 12
    assert fsck.check(root).problems == []


def test_a_log_missing_its_first_segment_is_held_back_without_a_checkpoint(
    tmp_path: Path,
) -> None:
    root = build_root(tmp_path)
    lead = agent_dirs(root)["lead"]
    first = list_sealed(lead / "events.jsonl")[0]
    first.path.unlink()  # removed by hand: nothing in substrat deletes history
    assert fsck.check(root).kinds().get("missing_segment") == 1
    snap, report = reopen(root)  # the checkpoint still holds: the state is whole
    assert report.checkpoints_rejected == {} and "lead" in snap["agents"]
    # but not its conversation: refused rather than rebuilt from what is left
    assert snap["agents"]["lead"]["history"] == "gone"
    shutil.rmtree(root / CHECKPOINTS_DIR)  # and now nothing says what that segment held
    snap, report = reopen(root)
    held = {u.session_id: u for u in report.unreadable}
    assert lead.name in held and "segments before it are missing" in held[lead.name].error
    assert "lead" not in snap["agents"]


# -- checkpoints survive a power loss -------------------------------------------------


def test_checkpoints_written_before_a_power_loss_are_used_after_it() -> None:
    """A checkpoint is fsynced when it is appended, so a power loss right after a kill
    (only what was fsynced survives; faultfs gives that disk) still finds the
    checkpoints, and the restart reads only what follows them. Unsynced, they were
    gone, and the restart after a crash (when start-up time matters most) read every
    log in full."""
    from faultfs import FaultFS

    top = "/checkpoints-power-loss"
    root = Path(top) / "root"
    fs = FaultFS(top)

    async def work_then_kill() -> None:
        orch = await Orchestrator.open(root, checkpoints=SMALL, slots=1)
        await orch.create_root("lead", "You coordinate.")
        await orch.run_turn("lead", "@spawn a worker\n@spawn b worker")
        for i in range(3):
            await orch.run_turn("lead", f"@ask a question {i}\n@send b note {i}")
            await orch.run_pending()
        exit_without_close(orch)  # killed: no clean shutdown, no closing checkpoints

    with fs:
        run(work_then_kill())
        written = sum(len(items) for items in read_store(root).checkpoints.values())
    assert written >= 3
    with fs.crash_image("power"):
        snap, report = reopen(root)
        logs_only = reopen_without_checkpoints(root)
    assert report.checkpoints_used >= 3, report
    assert report.read_in_full == [], report
    assert snap == logs_only


def reopen_without_checkpoints(root: Path) -> dict[str, Any]:
    shutil.rmtree(root / CHECKPOINTS_DIR)
    snap, report = reopen(root)
    assert report.checkpoints_used == 0
    return snap
