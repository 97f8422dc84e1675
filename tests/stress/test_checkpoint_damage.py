"""Damaged checkpoints, under every compaction policy: never a wrong state.

Hypothesis draws a workload, a checkpoint policy (small thresholds, so logs
get several checkpoints, sealed segments and, by policy, archives or
deletions) and one kind of damage done to the stopped root:

Under ``delete`` the logs' first segments go once a durable checkpoint covers
them, so a store that lost its checkpoints leaves each such log to its base
(``events.base``, :mod:`substrat.logbase`), never to a wrong state.

* lossless: none at all (a clean restart), the checkpoint store's last line
  torn, a byte flipped in it, the store deleted, or every log's newest
  checkpoint gone (the one before it is used). Nothing of the logs changed,
  so the state must be exactly the one the daemon had before it stopped, and
  no checkpoint may be rejected;
* lossy: a checkpoint filed under another log, the logs restored from an
  older backup (every checkpoint now ahead of its log), a log's first line
  dropped (every later line moved), or a line removed whole from the middle of
  a log after its (older) checkpoint, which still holds: no damaged byte, only
  a ``seq`` missing. The logs changed, so the state must be the one the logs
  alone give (the store removed), and the bad checkpoints must be reported as
  rejected (the removed line: the gap must be reported).

It runs on an in-memory file system (faultfs, no crash armed): only the
damage is under test here; crashes are the crash fuzzer's and the sweep's.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from faultfs import FaultFS
from oracle.kill import exit_without_close
from substrat.checkpointer import COMPACTION_MODES, CheckpointPolicy
from substrat.checkpoints import Checkpoint, encode_store, read_store, store_path
from substrat.orchestrator import Orchestrator
from substrat.segments import active_start, list_sealed

pytestmark = pytest.mark.stress

T = TypeVar("T")
ROOT = "/substrat-damage/root"
LOSSLESS = ("none", "store_torn", "store_byte", "store_deleted", "newest_gone")
LOSSY = ("other_logs", "logs_older", "first_line_dropped", "line_removed")
STEPS = (
    ("lead", "@ask a q"),
    ("lead", "@send b note"),
    ("lead/a", "@complete done\n@send user hi"),
    ("lead/b", "@ask lead what"),
    ("lead", "@inbox"),
    ("pending", ""),
    ("ack", ""),
    ("evict", "lead/a"),
)


class Ids:
    """Deterministic ids and times, so a failing example replays byte for byte."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._ticks = itertools.count(1)

    def new_id(self) -> str:
        return f"{next(self._ids):032x}"

    def now(self) -> str:
        epoch = datetime(2026, 1, 1, tzinfo=UTC)
        return (epoch + timedelta(microseconds=next(self._ticks))).isoformat(
            timespec="microseconds"
        )


def _run(fs: FaultFS, coro: Coroutine[Any, Any, T]) -> T:
    with fs:
        return asyncio.run(coro)


def snapshot(orch: Orchestrator) -> dict[str, Any]:
    """What recovery rebuilds, histories included."""
    agents = {}
    for node in orch.tree.walk():
        agents[orch.tree.path(node.agent_id)] = (
            node.state.value,
            sorted(node.waiting_on),
            sorted(m.message_id for m in orch.inboxes.inbox(node.agent_id).all()),
            orch.turn_counts.get(node.agent_id),
            [(t.turn_id, t.prompt, t.response) for t in orch.history(node.agent_id)],
        )
    return {"agents": agents, "user": sorted(m.message_id for m in orch.user_inbox())}


async def _open(policy: CheckpointPolicy, ids: Ids) -> Orchestrator:
    return await Orchestrator.open(
        ROOT, checkpoints=policy, slots=1, new_id=ids.new_id, clock=ids.now
    )


async def _workload(
    policy: CheckpointPolicy, ids: Ids, steps: list[tuple[str, str]]
) -> dict[str, Any]:
    """Run ``steps``, then stop cleanly; returns the state just before stopping."""
    orch = await _open(policy, ids)
    if not orch.tree.roots():
        await orch.create_root("lead", "coordinate")
        await orch.run_turn("lead", "@spawn a worker\n@spawn b worker")
    for who, text in steps:
        if who == "pending":
            await orch.run_pending(max_turns=6)
        elif who == "ack":
            orch.ack_user_messages([m.message_id for m in orch.user_inbox()])
        elif who == "evict":
            await orch.evict(text)
        else:
            await orch.run_turn(who, text)
    live = snapshot(orch)
    await orch.close()
    return live


async def _reopen(policy: CheckpointPolicy, ids: Ids) -> tuple[dict[str, Any], Any]:
    orch = await _open(policy, ids)
    snap, report = snapshot(orch), orch.recovery_report
    exit_without_close(orch)  # no clean shutdown: it would write new checkpoints
    return snap, report


def _store(checkpoints: list[Checkpoint]) -> bytes:
    return encode_store(checkpoints)


def _write(path: Any, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)


def _read(path: Any) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _remove_a_line(held: dict[str, list[Checkpoint]], pick: int) -> bool:
    """Remove one line whole from the active file of a log, after its oldest checkpoint
    and before its last line (a gap only the ``seq`` numbers show); False if no log has
    such a line. ``pick`` chooses which."""
    places = []
    for endpoint, items in sorted(held.items()):
        directory = "user" if endpoint == "user" else f"agents/{endpoint}"
        log = f"{ROOT}/{directory}/events.jsonl"
        lines = _read(log).splitlines(keepends=True)
        at = items[0].at
        offset = 0
        for index, line in enumerate(lines[:-1]):
            in_active = at.file_first == active_start(log, list_sealed(log))
            if not in_active or offset > at.offset:
                places.append((log, index))
            offset += len(line)
    if not places:
        return False
    log, index = places[pick % len(places)]
    lines = _read(log).splitlines(keepends=True)
    _write(log, b"".join(lines[:index] + lines[index + 1 :]))
    return True


def _damage(fs: FaultFS, older: FaultFS, damage: str, pick: int = 0) -> tuple[FaultFS, bool, bool]:
    """Damage the stopped root; returns the damaged disk, whether a checkpoint must be
    reported as rejected, and whether a line was removed whole (a gap to report)."""
    path = store_path(ROOT)
    with fs:
        store = read_store(ROOT)
        # their facts text, while the store they were read from is there
        held = {e: [c.held() for c in items] for e, items in store.checkpoints.items()}
    newest = {e: items[-1] for e, items in held.items()}
    rejected = removed = False
    with fs:
        if damage == "store_torn":
            data = _read(path)
            _write(path, data[: max(0, len(data) - 25)])
        elif damage == "store_byte":
            data = bytearray(_read(path))
            data[len(data) // 2] ^= 0x01
            _write(path, bytes(data))
        elif damage == "store_deleted":
            import os

            os.unlink(path)
        elif damage == "newest_gone":
            _write(path, _store([items[0] for items in held.values()]))
        elif damage == "other_logs":
            names = sorted(newest)
            other = dict(zip(names, names[1:] + names[:1], strict=True))
            _write(
                path,
                _store([Checkpoint(e, newest[o].at, newest[o].facts) for e, o in other.items()]),
            )
            rejected = len(names) > 1
        elif damage == "first_line_dropped":
            _write(path, _store(list(newest.values())))
            lead = min(e for e in newest if e != "user")
            log = f"{ROOT}/agents/{lead}/events.jsonl"
            lines = _read(log).splitlines(keepends=True)
            if len(lines) >= 2:
                _write(log, b"".join(lines[1:]))
                rejected = True
        elif damage == "line_removed":
            _write(path, _store([items[0] for items in held.values()]))
            removed = _remove_a_line(held, pick)
    if damage == "logs_older":
        with older:
            kept = {e: items[-1].at for e, items in read_store(ROOT).checkpoints.items()}
            _write(path, _store(list(newest.values())))
        # every checkpoint written since the backup is ahead of its log now
        return older, any(kept.get(e) != c.at for e, c in newest.items()), False
    return fs, rejected, removed


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(  # lead's enqueue of a's result dropped; only a's log still said it was sent
    first=[("lead/a", "@complete done\n@send user hi")],
    second=[("lead/a", "@complete done\n@send user hi")],
    every=5,
    segment=829,
    compaction="keep",
    damage="first_line_dropped",
    pick=0,
)
@example(  # a request's enqueue removed whole from lead's log after lead's older checkpoint
    first=[("lead", "@ask a q")],
    second=[("lead", "@ask a q")] * 4,
    every=2,
    segment=915,
    compaction="keep",
    damage="line_removed",
    pick=0,
)
@given(
    first=st.lists(st.sampled_from(STEPS), min_size=1, max_size=6),
    second=st.lists(st.sampled_from(STEPS), min_size=1, max_size=6),
    every=st.integers(2, 6),
    segment=st.integers(300, 2000),
    compaction=st.sampled_from(COMPACTION_MODES),
    damage=st.sampled_from(LOSSLESS + LOSSY),
    pick=st.integers(0, 50),
)
def test_a_damaged_checkpoint_never_makes_a_wrong_state(
    first: list[tuple[str, str]],
    second: list[tuple[str, str]],
    every: int,
    segment: int,
    compaction: str,
    damage: str,
    pick: int,
) -> None:
    policy = CheckpointPolicy(every_entries=every, segment_bytes=segment, compaction=compaction)
    fs = FaultFS(ROOT, record_trace=False)
    ids = Ids()
    _run(fs, _workload(policy, ids, first))
    older = fs.crash_image("process")  # a backup of the root as it was then
    before = _run(fs, _workload(policy, ids, second))
    disk, rejected, removed = _damage(fs, older, damage, pick)
    if damage in LOSSLESS:
        want = before
    else:
        logs_only = disk.crash_image("process")
        with logs_only:
            import shutil

            shutil.rmtree(store_path(ROOT).parent)
        want, _ = _run(logs_only, _reopen(policy, ids))
    after, report = _run(disk, _reopen(policy, ids))
    assert after == want, f"{damage}: the state is not what the logs say"
    if rejected:
        assert report.checkpoints_rejected, f"{damage}: no checkpoint reported rejected"
    if removed:
        assert report.log_gaps or report.checkpoints_rejected, f"{damage}: not reported"
    if damage in LOSSLESS:
        # under delete, an older checkpoint naming a segment the policy deleted is rejected
        # (its log's base, or a newer one, is used): nothing else may be
        bad = {
            e: why
            for e, why in report.checkpoints_rejected.items()
            if not (compaction == "delete" and why.startswith("the segment starting at seq"))
        }
        assert not bad, f"{damage}: {bad}"
