"""The user's inbox decoded when first asked for holds what a start that decodes it holds.

A start defers the user's checkpointed messages (:mod:`substrat.recovery_user`) when
the start summary vouches for them (:mod:`substrat.summary_user`: the clean stop that
wrote it decoded them). On the varied history of ``test_start_lazy`` (messages to the
user, one acknowledged, others unread), each test starts the same root twice, once
with the summary's user entry and once with a summary that has none (as a clean stop
writes it when it cannot vouch), and compares: everything the orchestrator holds
(every inbox message, in order), the recovery report (the redelivered messages in
their order, before the inbox is read), the user's inbox after a new message to the
user and after an acknowledgement (and what the next start reads of that). A user
checkpoint whose facts do not read, with a damaged line in the user's log besides, is
never vouched for: the start decodes it, sets the store aside and reads every log, as
without a summary. A format 2 summary is still read, the user's facts decoded at start.
A summary that vouched for facts that do not read (what a clean stop never writes)
falls back to the user's log when the inbox is first read.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from oracle.kill import abandon, exit_without_close
from substrat import start_summary, summary_user
from substrat.agents import USER
from substrat.checkpointer import CheckpointPolicy
from substrat.checkpoints import store_path
from substrat.eventlog import LOG_NAME, decode_line, encode_entry
from substrat.orchestrator import Orchestrator
from tests.integration.test_start_lazy import POLICY, _counter, _fixed_clock, build_root, state


def _open(root: Path, *, deferred: bool) -> Orchestrator:
    async def go() -> Orchestrator:
        return await Orchestrator.open(
            root, checkpoints=POLICY, slots=1, clock=_fixed_clock, new_id=_counter()
        )

    orch = asyncio.run(go())
    assert (USER in orch.inboxes._deferred) is deferred  # nothing read it yet
    return orch


def _edit_summary(root: Path, head: Any = None) -> None:
    """The summary without its user entry (as a clean stop writes it when it cannot
    vouch), said to be the copy's, and what ``head`` says in its first line."""
    path = Path(start_summary.summary_path(root))
    lines = path.read_bytes().split(b"\n")[1:]
    for i, line in enumerate(lines[1:], 1):
        chunk = orjson.loads(line)
        for row in chunk:
            if row[0] == USER:
                row[2] = None
        lines[i] = orjson.dumps(chunk)
    # the copy's store is a new file: the summary is said to be the copy's
    head = {**orjson.loads(lines[0]), **(head or {})}
    head["store"] = start_summary.fingerprint(os.stat(store_path(root)))
    lines[0] = orjson.dumps(head)
    body = b"\n".join(lines)
    path.write_bytes(b"%d %d\n" % (zlib.crc32(body), len(body)) + body)
    summary, _ = start_summary.load(root)
    assert summary is not None and summary.user is None
    summary.close()


def _two(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    root = build_root(tmp_path)
    summary, _ = start_summary.load(root)
    assert summary is not None and summary.user is not None  # the clean stop vouched
    summary.close()
    copy = tmp_path / "eager"
    shutil.copytree(root, copy)
    _edit_summary(copy)
    return root, copy


def _user(orch: Orchestrator) -> list[tuple[str, str, str]]:
    return [(m.message_id, m.sender, m.payload) for m in orch.user_inbox()]


def _summary_bytes(root: Path) -> bytes:
    summary, _ = start_summary.load(root)
    assert summary is not None and summary.user is not None  # the clean stop vouched
    summary.close()
    return Path(start_summary.summary_path(root)).read_bytes()


def _again(root: Path, kept: bytes, head: Any = None) -> Orchestrator:
    """The root started again, as it was (the start before wrote nothing), with the
    summary ``kept`` put back without its user entry (and ``head``): it decodes."""
    Path(start_summary.summary_path(root)).write_bytes(kept)
    _edit_summary(root, head)
    return _open(root, deferred=False)


def test_a_deferred_user_inbox_holds_what_a_decoded_one_holds(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    kept = _summary_bytes(root)
    lazy = _open(root, deferred=True)
    exit_without_close(lazy)
    lazy_report = lazy.recovery_report
    assert lazy_report is not None
    before = lazy_report.to_dict()  # before the inbox is read
    assert USER in lazy.inboxes._deferred
    got = state(lazy)  # every inbox read: the user's decoded now
    assert USER not in lazy.inboxes._deferred
    eager = _again(root, kept)
    exit_without_close(eager)
    eager_report = eager.recovery_report
    assert eager_report is not None
    # the report as a decoding start makes it, redelivered in the same order
    assert before == eager_report.to_dict() == lazy_report.to_dict()
    unread = _user(eager)
    assert len(unread) >= 2 and set(before["redelivered"]) >= {m for m, _, _ in unread}
    want = state(eager)
    for part in want:
        assert got[part] == want[part], part
    assert _user(lazy) == unread


def test_a_user_log_grown_after_the_summary_is_read_not_deferred(tmp_path: Path) -> None:
    """A message to the user after the clean stop, then a kill before any checkpoint (the
    summary put back, as a hand copy would): the user's log is not as the entry says, so
    the start reads it, message and all."""
    root = build_root(tmp_path)
    kept = _summary_bytes(root)

    async def after() -> None:
        orch = await Orchestrator.open(root, checkpoints=CheckpointPolicy.off(), slots=1)
        await orch.run_turn("lead/a", "@send user after the summary")
        abandon(orch)

    asyncio.run(after())
    Path(start_summary.summary_path(root)).write_bytes(kept)
    orch = _open(root, deferred=False)
    report = orch.recovery_report
    assert report is not None and USER in report.summary_passed_over
    assert _user(orch)[-1][2] == "after the summary"
    exit_without_close(orch)


def test_the_report_interleaves_the_user_messages_with_the_others_by_arrival() -> None:
    others = [("2030-01-01T00:00:01Z", "b"), ("2030-01-01T00:00:03Z", "d")]
    stamps = ["2030-01-01T00:00:00Z", "2030-01-01T00:00:02Z", "2030-01-01T00:00:03Z"]
    assert summary_user.merged(stamps, ["a", "c", "e"], others) == ["a", "b", "c", "d", "e"]
    assert summary_user.merged(stamps, ["a", "c", "e"], []) == ["a", "c", "e"]


def test_a_message_to_the_user_and_an_ack_after_a_deferred_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's unread messages stay before one sent after the start (the message asks
    for the inbox, which delivers them first); an acknowledgement is logged as after a
    decoding start, and the next start reads the same inbox of both roots."""
    root, copy = _two(tmp_path, monkeypatch)
    seen: list[list[tuple[str, str, str]]] = []
    for path, deferred in ((root, True), (copy, False)):
        orch = _open(path, deferred=deferred)

        async def go(orch: Orchestrator = orch) -> None:
            await orch.run_turn("lead/a", "@send user after the start")
            first = orch.user_inbox()[0].message_id
            assert orch.ack_user_messages([first]) == [first]
            await orch.close()

        asyncio.run(go())
        again = _open(path, deferred=True)  # the clean stop vouched for both
        seen.append(_user(again))
        exit_without_close(again)
    assert seen[0] == seen[1]
    assert seen[0][-1][2] == "after the start"


def _entry(line: bytes) -> Any:
    return decode_line(line[:-1])


def _spoil_user_checkpoint(root: Path) -> None:
    """The user's newest checkpoint in the store holds a pending message of a kind from a
    newer version (its line checksummed again: only its facts do not read)."""
    path = Path(store_path(root))
    lines = path.read_bytes().splitlines(keepends=True)
    index = max(i for i, line in enumerate(lines) if _entry(line)["data"]["endpoint"] == USER)
    entry = _entry(lines[index])
    facts = orjson.loads(entry["data"]["facts"])
    assert facts["pending"]
    facts["pending"][0]["kind"] = "telepathy"
    entry["data"]["facts"] = orjson.dumps(facts).decode()
    lines[index] = encode_entry(entry)
    path.write_bytes(b"".join(lines))


def _damage_user_log(root: Path) -> None:
    """A line of the user's log, in the part its checkpoint covers, damaged."""
    log = root / "user" / LOG_NAME
    data = bytearray(log.read_bytes())
    data[data.index(b'"seq"') + 1] ^= 0x20  # the first line's, not the checkpoint's
    log.write_bytes(bytes(data))


def test_facts_that_do_not_read_are_never_vouched_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a second fault (a damaged line in the user's log) the start that finds the
    user's checkpoint does not read sets every checkpoint aside: one with the summary a
    clean stop (or ``fsck --repair``) writes then ends as one without a summary."""
    root = build_root(tmp_path)
    _spoil_user_checkpoint(root)
    _damage_user_log(root)
    copy = tmp_path / "no-summary"
    shutil.copytree(root, copy)
    (copy / "checkpoints" / start_summary.SUMMARY_NAME).unlink()
    assert start_summary.write(root)  # what a clean stop writes of this root now
    summary, _ = start_summary.load(root)
    assert summary is not None and summary.user is None and summary.agents
    summary.close()
    lazy = _open(root, deferred=False)
    eager = _open(copy, deferred=False)
    lazy_report, eager_report = lazy.recovery_report, eager.recovery_report
    assert lazy_report is not None and eager_report is not None
    assert USER in lazy_report.checkpoints_rejected and lazy_report.checkpoints_set_aside
    # the second fault: a message the damaged line held, rolled forward from its sender's
    # log, which only a start that read every log in full still had
    assert any(item.startswith("message:") for item in eager_report.reconciled)
    want, got = state(eager), state(lazy)
    for part in want:
        assert got[part] == want[part], part
    assert lazy_report.redelivered == eager_report.redelivered
    assert lazy_report.checkpoints_rejected == eager_report.checkpoints_rejected
    exit_without_close(lazy)
    exit_without_close(eager)


def test_a_format_2_summary_is_read_and_the_user_decoded_at_start(tmp_path: Path) -> None:
    root = build_root(tmp_path)
    kept = _summary_bytes(root)
    head = orjson.loads(kept.split(b"\n")[1])
    assert head["format"] == start_summary.FORMAT == 3
    lazy = _open(root, deferred=True)
    exit_without_close(lazy)
    got = state(lazy)
    old = _again(root, kept, {"format": 2})
    exit_without_close(old)
    lazy_report, old_report = lazy.recovery_report, old.recovery_report
    assert lazy_report is not None and old_report is not None
    assert old_report.start_summary is None and old_report.summary_used > 0
    assert lazy_report.to_dict() == old_report.to_dict()
    want = state(old)
    for part in want:
        assert got[part] == want[part], part


def test_a_summary_that_vouched_for_unreadable_facts_falls_back_to_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What a clean stop never writes (its entry decoded nothing), or the store's bytes
    damaged after it without changing its fingerprint: the user's log is read without
    the checkpoint when the inbox is first read, the checkpoint not built on."""
    root = build_root(tmp_path)
    copy = tmp_path / "no-summary"
    for path in (root, copy):
        if path is copy:
            shutil.copytree(root, copy)
            (copy / "checkpoints" / start_summary.SUMMARY_NAME).unlink()
        _spoil_user_checkpoint(path)
    summary_file = Path(start_summary.summary_path(root))
    with monkeypatch.context() as patch:  # the entry as the facts were before
        original = summary_user.entry

        def vouch_anyway(checkpoint: Any, log_fingerprint: list[int]) -> Any:
            return original(checkpoint, log_fingerprint) or [log_fingerprint, [], []]

        patch.setattr(summary_user, "entry", vouch_anyway)
        assert start_summary.write(root)
    assert summary_file.exists()
    lazy = _open(root, deferred=True)
    spoiled = lazy.inboxes._deferred[USER][0].__self__  # type: ignore[attr-defined]
    checkpoint = spoiled.checkpoint
    eager = _open(copy, deferred=False)
    with caplog.at_level(logging.WARNING, logger="substrat.recovery"):
        got_user = _user(lazy)
    assert "did not read when the inbox was first asked for" in caplog.text
    assert got_user == _user(eager)
    kept = lazy.checkpointer._kept(USER) or []
    assert checkpoint not in kept  # not built on: what the log's read took instead
    assert [c.at for c in kept] == [c.at for c in eager.checkpointer._kept(USER) or []]
    exit_without_close(lazy)
    exit_without_close(eager)
