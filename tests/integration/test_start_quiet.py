"""A quiet agent that recovery must treat otherwise is what a start without the summary makes of it.

A start takes the quiet agents of its start summary whole, in the scan's pass
(:mod:`substrat.recovery_quiet`); one whose parent turns out terminated (a cascade a
crash cut short), whose parent cannot be read (held back with it), or whose
checkpoint is set aside with every other (another log lost entries) is demoted to
the general path. Each case here starts a root from the summary and without it (the
summary removed) and compares everything the orchestrator holds of every agent,
field by field (``tests/integration/test_start_lazy.py``'s comparison).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from substrat import events, start_summary
from substrat.eventlog import LOG_NAME, EventLog
from tests.integration.test_start_lazy import _copy, build_root, opened, state


def _built(tmp_path: Path) -> tuple[Path, Path, dict[str, tuple[str, str]]]:
    """test_start_lazy's root, to start from its summary (a copy's summary does not
    hold: the store's fingerprint names its file), a copy of it without the summary, and
    path -> (session id, agent id) of its agents."""
    root = build_root(tmp_path)
    eager = _copy(root, "eager")
    os.unlink(start_summary.summary_path(eager))
    orch, _ = opened(_copy(root, "look"))
    ids = {path: orch.tree.resolve(path) for path in orch.tree.paths()}
    return root, eager, {path: (node.session_id, node.agent_id) for path, node in ids.items()}


def _log(root: Path, sid: str) -> Path:
    return root / "agents" / sid / LOG_NAME


def _same_starts(lazy: Path, eager: Path) -> tuple[Any, Any]:
    got, got_report = opened(lazy)
    want, want_report = opened(eager)
    assert got_report.summary_used > 0 and want_report.summary_used == 0
    assert state(got) == state(want)
    return got_report, want_report


def test_a_quiet_child_of_a_parent_terminated_since_is_terminated_as_without_it(
    tmp_path: Path,
) -> None:
    """``lead/a`` terminated by hand (its cascade cut short): ``lead/a/deep``, quiet in
    the summary, is terminated by recovery's cascade in both starts."""
    lazy, eager, ids = _built(tmp_path)
    parent_sid, parent_id = ids["lead/a"]
    deep_sid = ids["lead/a/deep"][0]
    for copy in (lazy, eager):
        log = EventLog(_log(copy, parent_sid), {"session_id": parent_sid})
        log.log(events.AGENT_TERMINATED, {"agent_id": parent_id, "by": "test"})
        log.close()
    got, want = _same_starts(lazy, eager)
    assert got.cascaded == want.cascaded == [deep_sid]


def test_a_quiet_child_of_an_unreadable_parent_is_held_back_as_without_it(
    tmp_path: Path,
) -> None:
    """``lead/a``'s log cannot be opened (a directory in its place): ``lead/a/deep``,
    quiet in the summary, is held back with it in both starts."""
    lazy, eager, ids = _built(tmp_path)
    parent_sid = ids["lead/a"][0]
    deep_sid = ids["lead/a/deep"][0]
    for copy in (lazy, eager):
        os.unlink(_log(copy, parent_sid))
        os.mkdir(_log(copy, parent_sid))
    got, want = _same_starts(lazy, eager)
    held = [item.session_id for item in got.unreadable]
    assert held == [item.session_id for item in want.unreadable]
    assert sorted(held) == sorted([parent_sid, deep_sid])


def test_quiet_agents_are_read_in_full_when_every_checkpoint_is_set_aside(
    tmp_path: Path,
) -> None:
    """A damaged line in ``solo``'s log after its checkpoint (its turn after the
    summary): every checkpoint is set aside, the quiet agents' too, and every log is
    read from its start in both starts."""
    lazy, eager, ids = _built(tmp_path)
    solo_sid = ids["solo"][0]
    for copy in (lazy, eager):
        path = _log(copy, solo_sid)
        lines = path.read_bytes().split(b"\n")
        lines[-3] = lines[-3][:-3] + b"~~}"  # its checksum no longer holds; a line follows
        path.write_bytes(b"\n".join(lines))
    got, got_report = opened(lazy)
    want, want_report = opened(eager)
    assert got_report.start_summary is None  # it held, and was set aside with the store
    assert got_report.checkpoints_set_aside is not None
    assert got_report.checkpoints_set_aside == want_report.checkpoints_set_aside
    assert got_report.checkpoints_used == got_report.summary_used == 0
    assert sorted(got_report.read_in_full) == sorted(want_report.read_in_full)
    assert len(got_report.read_in_full) == len(got.tree) + 1  # every log, the user's too
    assert state(got) == state(want)


def test_a_quiet_agents_log_appended_to_under_the_summary_is_read_not_taken(
    tmp_path: Path,
) -> None:
    """``lead/a/deep``, quiet in the summary, terminated by hand in the stopped root (an
    entry appended to its log): the one ``stat`` of its log the start makes shows it, and
    both starts read its log (it leaves the tree)."""
    lazy, eager, ids = _built(tmp_path)
    deep_sid, deep_id = ids["lead/a/deep"]
    summary, _ = start_summary.load(lazy)
    assert summary is not None and start_summary.quiet_row(summary.agents[deep_sid][2])
    summary.close()
    for copy in (lazy, eager):
        log = EventLog(_log(copy, deep_sid), {"session_id": deep_sid})
        log.log(events.AGENT_TERMINATED, {"agent_id": deep_id, "by": "test"})
        log.close()
    got, _ = _same_starts(lazy, eager)
    assert deep_sid in got.summary_passed_over
    orch, _ = opened(_copy(lazy, "again"))
    assert orch.tree.by_session(deep_sid) is None
