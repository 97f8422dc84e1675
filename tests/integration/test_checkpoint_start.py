"""A start on checkpointed logs: what it skips, and what it still checks.

* A log its (verified) checkpoint covers to the last byte, with no pending
  entry, is not opened for repair at all; a byte past the checkpoint, or a
  pending entry left by a crash, and the log is repaired from the checkpoint
  on as before (the pending entry replayed, the torn bytes cut).
* A checkpoint made due inside an append (the log's hook runs after the
  append's fsync) never seals the log being appended to: the seal waits for
  the next poke, so the caller's open log keeps working.
* The cyclic garbage collector stays paused while the orchestrator applies
  what recovery read (its passes over a 10,000-agent heap freed nothing), and
  runs again after.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from oracle.bench_checkpoints import checkpointed_log
from substrat import recovery_logs, restore
from substrat.checkpointer import CheckpointPolicy
from substrat.checkpoints import CheckpointStore, read_store
from substrat.eventlog import PENDING_NAME, encode_entry, read_log
from substrat.segments import list_sealed
from tests.integration.test_checkpoints import agent_dirs, build_root, from_the_logs, reopen


def _count_repairs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    opened: list[str] = []
    real = recovery_logs.repair_log

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(Path(path).parent.name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(recovery_logs, "repair_log", counting)
    return opened


def test_logs_their_checkpoints_cover_to_the_end_are_not_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = build_root(tmp_path)
    want = from_the_logs(root, tmp_path)
    opened = _count_repairs(monkeypatch)
    snap, report = reopen(root)
    assert snap == want
    assert report.events_read == 0 and report.read_in_full == []
    assert opened == [], f"logs opened for repair although checkpointed to their end: {opened}"


def test_a_tail_or_a_pending_entry_past_the_checkpoint_is_still_repaired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = build_root(tmp_path)
    dirs = agent_dirs(root)
    torn, pending = dirs["a"], dirs["b"]
    with open(torn / "events.jsonl", "ab") as handle:
        handle.write(b'{"crc":"00000000","seq":')  # a torn append, never acknowledged
    last = dict(read_log(pending / "events.jsonl").entries[-1])
    last.pop("crc", None)
    # a crash after an append's pending copy was written, before the log's: replayed
    (pending / PENDING_NAME).write_bytes(encode_entry({**last, "seq": last["seq"] + 1}))
    opened = _count_repairs(monkeypatch)
    _, report = reopen(root)
    assert sorted(opened) == sorted([torn.name, pending.name]), opened
    assert report.log_repairs[torn.name]["truncated_bytes"] > 0
    assert report.checkpoints_rejected == {}
    assert report.log_repairs[pending.name]["pending_replayed"] is True
    assert not (pending / PENDING_NAME).exists()
    assert read_log(pending / "events.jsonl").entries[-1]["seq"] == last["seq"] + 1


def test_a_checkpoint_due_inside_an_append_seals_the_log_only_after_it(tmp_path: Path) -> None:
    policy = CheckpointPolicy(every_entries=1, segment_bytes=100)
    pool, checkpointer, log = checkpointed_log(tmp_path, policy)
    sid = log.path.parent.name
    for i in range(4):  # each append makes a checkpoint due, and its file big enough to seal
        log.log("turn.start", {"turn_id": f"t{i + 1}", "prompt": "x" * 80})
    assert checkpointer.stats.written == 4
    assert list_sealed(pool.path(sid)) == []  # never while the log was being appended to
    checkpointer.poke()  # an operation answered: now it seals
    assert len(list_sealed(pool.path(sid))) == 1
    assert [e["seq"] for e in read_log(pool.path(sid)).entries] == [1, 2, 3, 4]
    pool.close_all()


def test_a_released_checkpoint_reads_its_facts_back_from_its_line(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    read = read_store(root)
    held = [c for items in read.checkpoints.values() for c in items]
    assert held and all(c.stored is not None for c in held)
    want = {id(c): c.facts for c in held}
    for checkpoint in held:  # what a restart does with the one it uses
        checkpoint.release()
    assert all(c.text is None for c in held)
    assert {id(c): c.facts for c in held} == want  # read back from the store
    assert all(c.load_facts().session_id == c.endpoint for c in held)
    # the checkpointer's rewrite moves every line: each checkpoint follows its own
    CheckpointStore(root).rewrite({c.endpoint: [c] for c in held[::2]})
    kept, dropped = held[::2], [c for c in held if c not in held[::2]]
    assert [c.facts for c in kept] == [want[id(c)] for c in kept]
    for checkpoint in dropped:  # their old places now hold other lines, or nothing
        with pytest.raises(ValueError):
            checkpoint.load_facts()


def test_the_collector_is_paused_while_a_start_applies_what_it_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = build_root(tmp_path)
    seen: list[bool] = []
    real = restore.apply

    def watching(host: Any, recovered: Any) -> Any:
        seen.append(gc.isenabled())
        return real(host, recovered)

    monkeypatch.setattr(restore, "apply", watching)
    assert gc.isenabled()
    reopen(root)
    assert seen == [False]
    assert gc.isenabled()
