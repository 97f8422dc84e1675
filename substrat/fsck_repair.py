"""``substrat fsck --repair``: the repairs, once :mod:`substrat.fsck` has found what to do.

File-level fixes first (stray temp files and a stale socket removed; bad names,
corrupt records and an unusable root registry moved to ``quarantine/``), then
every log is opened with ``EventLog`` (cuts torn tails, replays or drops the
pending entry) and rewritten without its damaged lines (atomically; the lines
go to ``quarantine/``), then recovery runs (the code the daemon runs at start),
and sessions it cannot rebuild are moved to ``quarantine/`` whole. An agent
whose files cannot be read is skipped and left exactly as it is.
"""

from __future__ import annotations

import asyncio
import gzip
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from substrat import events, fsck_checkpoints, incidents, persistence, rootmarker, start_summary
from substrat.checkpoints import read_store
from substrat.errors import SubstratError
from substrat.eventlog import LOG_NAME, PENDING_NAME, EventLog, decode_line
from substrat.facts import names_turn, turn_ceiling
from substrat.logs import USER_DIR
from substrat.registry import registry_path
from substrat.restore import OUTCOME_UNKNOWN
from substrat.root_hold import RootHold
from substrat.rootnest import root_within
from substrat.segments import (
    GZIP_LEVEL,
    Segment,
    SegmentDamaged,
    history_files,
    list_sealed,
    read_segment,
)
from substrat.session import SessionStore
from substrat.session.store import AGENTS_DIR, QUARANTINE_DIR


class _Finding(Protocol):
    kind: str
    path: str
    repair: str | None
    repaired: bool


class _Report(Protocol):
    """What the repairs need of :class:`substrat.fsck.FsckReport`."""

    recovery: dict[str, Any] | None

    @property
    def problems(self) -> Sequence[_Finding]: ...


_MOVED_ASIDE = {
    "bad_registry": "registry",
    "bad_user_log": "user-events.jsonl",
    "bad_checkpoints": "checkpoints-events.jsonl",
}
"""Findings of a wrong-type root file that the repair moves to quarantine/ (its name there)."""


def repair_root(root: Path, report: _Report, hold: RootHold) -> None:
    """Repair what ``report`` found (the lock is held exclusively, and ``hold``: no
    orchestrator has the root open); see substrat.fsck."""
    # before the first write (see substrat.start_summary): the open below writes a
    # new one when it closes
    start_summary.retire(root)
    rootmarker.upgrade(root)  # as a recovery does (see substrat.rootmarker)
    # before the checkpoints that tell it are dropped below (see substrat.incidents)
    found = incidents.behind_in_store(root, read_store(root))
    incidents.record(root, found, "substrat fsck --repair")
    store = SessionStore(root)
    quarantine = root / QUARANTINE_DIR
    kinds = {f.kind for f in report.problems}
    for finding in report.problems:
        target = root / finding.path
        if finding.kind in ("stray_temp", "stale_socket") and os.path.lexists(target):
            persistence.durable_unlink(target)
            finding.repaired = True
        elif finding.kind == "bad_name" and os.path.lexists(target):
            finding.repaired = _set_aside(root, target, f"bad-name.{target.name}")
        elif finding.kind == "damaged_start" and finding.repair and _not_a_file(target):
            # the log's open below writes it again from the segments' names
            _set_aside(root, target, f"{target.parent.name}.{target.name}")
        elif finding.kind in _MOVED_ASIDE and os.path.lexists(target):
            # recovery builds each again: the registry and the user's inbox from the
            # agents' logs, the checkpoint store from every log it reads
            _set_aside(root, target, _MOVED_ASIDE[finding.kind])
    if "corrupt_record" in kinds:
        store.scan(quarantine=True)
    logs = [store.log_path(sid) for sid in store.list_dirs()[0]]
    shared = (registry_path(root), incidents.incidents_path(root))  # no checkpoint counts on
    logs += [root / USER_DIR / LOG_NAME, *shared]
    # entries missing whole (seq_gap): what a sender's checkpoint forgot may be among them
    # and a user's inbox moved aside: the senders' checkpoints forgot what it held
    lines_lost = "seq_gap" in kinds or "bad_user_log" in kinds
    closed: list[tuple[str, dict[str, Any]]] = []  # turns closed in doubt (session id, turn)
    for log_path in logs:
        try:
            if (
                os.path.exists(log_path)
                or os.path.exists(log_path.with_name(PENDING_NAME))
                or list_sealed(log_path)
            ):
                # counted before the open, which cuts a damaged last line off (unless
                # a pending copy restores it): that line may have been a turn's start
                ceiling = _agent_turn_ceiling(log_path)
                opened = EventLog(log_path)  # the open repairs a damaged last line away
                opened.close()  # and close removes the pending file
                cut = opened.report.whole_lines_cut()
                dropped = _drop_damaged_lines(log_path, quarantine, ceiling, closed)
                if (dropped or cut) and log_path not in shared:
                    lines_lost = True  # an agent's or the user's: checkpoints count on it
        except OSError:
            continue  # unreadable (reported): it is left exactly as it is
    # after the log rewrites (which move lines): drop the checkpoints that no longer
    # agree, or all of them if a log lost lines; recovery reads those logs in full and
    # writes new checkpoints when it closes
    fsck_checkpoints.repair(root, lines_lost=lines_lost)
    report.recovery = asyncio.run(_recover(root, hold))
    for session_id, turn in closed:  # reported as the start reports a turn it closes so
        try:
            agent_id = store.load(session_id).agent_id or session_id
        except (OSError, SubstratError):  # its record is gone or damaged (reported)
            agent_id = session_id
        lost = report.recovery.setdefault("lost_turns", [])
        lost.append({"agent_id": agent_id, **turn, "record_damaged": True})
    moved = False
    for sid in report.recovery.get("unrecoverable", []):
        directory = store.session_dir(sid)
        if directory.exists():
            moved = _set_aside(root, directory, f"{sid}.session") or moved
    if moved:  # written after the summary the open's close wrote: summarised again
        start_summary.write(root)


async def _recover(root: Path, hold: RootHold) -> dict[str, Any]:
    from substrat.orchestrator import Orchestrator

    orch = await Orchestrator.open(root, hold=hold)
    try:
        report = orch.recovery_report
        return report.to_dict() if report is not None else {}
    finally:
        await orch.close()


def _agent_turn_ceiling(log_path: Path) -> int:
    """An agent log's turn ceiling (see substrat.facts); 0 for the other logs."""
    return turn_ceiling(log_path).value if log_path.parent.parent.name == AGENTS_DIR else 0


def _drop_damaged_lines(
    log_path: Path,
    quarantine: Path,
    ceiling_before_open: int,
    closed: list[tuple[str, dict[str, Any]]],
) -> int:
    """Rewrite a log (each of its segments) without its damaged lines, which go to
    ``quarantine/``.

    An agent's damaged line after its last readable turn line may have been
    the start of a turn (see substrat.facts): a ``turn.failed`` marked
    ``reserved`` keeps that turn's id from being handed out again. That holds
    for a damaged last line the open already cut as well (``ceiling_before_open``
    counted it). A turn left open with a damaged line after its start is closed
    as "outcome unknown" (:func:`_close_in_doubt`) and added to ``closed``.
    """
    ceiling = max(ceiling_before_open, _agent_turn_ceiling(log_path))
    highest = 0
    seen: set[int] = set()
    # the last turn started and not ended among the kept lines, and whether a damaged
    # line follows its start: its turn.complete may be that line (see _close_in_doubt)
    open_turn: dict[str, Any] | None = None
    in_doubt = False
    rewrites: list[tuple[Segment | None, Path, bytes, bytearray, bytearray]] = []
    for segment, path in history_files(log_path):
        if not path.exists():
            continue
        try:
            raw = persistence.read_bytes(path) if segment is None else read_segment(segment)
        except SegmentDamaged:
            continue  # kept as it is (reported): a rewrite would lose its unreadable tail
        keep = bytearray()
        dropped = bytearray()
        for piece in raw.split(b"\n")[:-1]:  # after EventLog's repair every line ends in \n
            decoded = decode_line(piece)
            if isinstance(decoded, str) or decoded["seq"] in seen:
                dropped += piece + b"\n"
                in_doubt = in_doubt or (open_turn is not None and isinstance(decoded, str))
                continue
            seen.add(decoded["seq"])
            keep += piece + b"\n"
            highest = max(highest, names_turn(decoded) or 0)
            open_turn, in_doubt = _turn_left_open(decoded, open_turn, in_doubt)
        if dropped:
            rewrites.append((segment, path, raw, keep, dropped))
    # What the damaged lines may have meant is written down before they go: a crash
    # between the two then leaves the lines and the note, and a second repair adds nothing.
    if open_turn is not None and in_doubt and log_path.parent.parent.name == AGENTS_DIR:
        _close_in_doubt(log_path, open_turn)
        closed.append((log_path.parent.name, open_turn))
    if ceiling > highest:
        with EventLog(log_path, {"session_id": log_path.parent.name}) as log:
            log.log(
                events.TURN_FAILED,
                {
                    "turn_id": f"t{ceiling}",
                    "error": "fsck --repair quarantined damaged lines that may have held "
                    "this turn's start; its id is reserved",
                    "reserved": True,
                },
            )
    count = 0
    for segment, path, raw, keep, dropped in rewrites:
        if segment is None:  # the active file: the notes above were appended to it
            now = persistence.read_bytes(path)
            assert now.startswith(raw), f"{path} changed under the repair"
            keep += now[len(raw) :]
        count += dropped.count(b"\n")
        persistence.durable_mkdir(quarantine)
        name = f"{log_path.parent.name}.{path.name}.damaged"
        persistence.atomic_write(_free_name(quarantine, name), bytes(dropped))
        if segment is not None and segment.archived:
            keep = bytearray(gzip.compress(bytes(keep), GZIP_LEVEL, mtime=0))
        persistence.atomic_write(path, bytes(keep))
    return count


def _turn_left_open(
    entry: dict[str, Any], open_turn: dict[str, Any] | None, in_doubt: bool
) -> tuple[dict[str, Any] | None, bool]:
    """The open turn and its doubt after a kept ``entry`` (read in the log's order)."""
    event, data = entry.get("event"), entry.get("data") or {}
    if event == events.TURN_START:
        return {"turn_id": str(data.get("turn_id")), "prompt": str(data.get("prompt", ""))}, False
    if event in (events.TURN_COMPLETE, events.TURN_FAILED) and not data.get("reserved"):
        return None, False  # an end line closes every older open turn (see substrat.facts)
    return open_turn, in_doubt


def _close_in_doubt(log_path: Path, turn: dict[str, Any]) -> None:
    """Close ``turn`` as recovery closes a lost turn with damaged lines after its start.

    Those lines go to ``quarantine/``: once they are out of the log, the turn would
    read as cut off by a crash (lost in flight, none of its tool calls taken effect)
    where its ``turn.complete`` may be among them, its effects applied. The close
    keeps that doubt, so the agent is told it may have completed.
    """
    with EventLog(log_path, {"session_id": log_path.parent.name}) as log:
        log.log(
            events.TURN_FAILED,
            {**turn, "error": OUTCOME_UNKNOWN, "lost": True, "record_damaged": True},
        )


def _not_a_file(path: Path) -> bool:
    return os.path.lexists(path) and not path.is_file()


def _set_aside(root: Path, target: Path, name: str) -> bool:
    """Move ``target`` to ``quarantine/`` as ``name`` (False: left where it is).

    Never a substrat root made inside this one, nor anything in one, nor into a
    ``quarantine/`` that is one (fsck reports each as ``nested_root``): its daemon may be
    running in it, and its user would find it gone."""
    quarantine = root / QUARANTINE_DIR
    current = target
    while current != root and root in current.parents:
        if root_within(current):
            return False
        current = current.parent
    if root_within(quarantine):
        return False
    persistence.durable_mkdir(quarantine)
    persistence.durable_rename(target, _free_name(quarantine, name))
    return True


def _free_name(directory: Path, stem: str) -> Path:
    index = 0
    while os.path.lexists(directory / f"{stem}.{index}"):
        index += 1
    return directory / f"{stem}.{index}"
