"""What ``substrat fsck`` checks of checkpoints and segments, and how ``--repair`` fixes it.

* The checkpoint store (``checkpoints/events.jsonl``): a torn tail or a damaged
  line costs only that checkpoint (recovery falls back to an older one, or to
  the log); reported, and dropped by ``--repair``.
* Each endpoint's newest checkpoint is checked against its log: the entry it
  names must be where it says (what recovery checks), and the whole prefix
  before it must have the length and CRC-32 it recorded (which only a full
  read, like fsck's, can check). One that disagrees is reported; ``--repair``
  drops it, and the recovery that ends the repair writes a new one from the
  log at its clean shutdown.
* The start summary (``checkpoints/start.json``, :mod:`substrat.start_summary`):
  one a start would not use (damaged, torn, stale, of another format) is
  reported; ``--repair`` builds it again from the disk (or removes it).
* Sealed segments: a segment missing between two others (its entries are
  lost); the first segments missing (lost, unless the ``delete`` compaction
  policy removed them: then the log's base, :mod:`substrat.logbase`, reads and
  covers them with a checkpoint that holds, and they are noted as deleted, not
  reported as damage); and a segment both plain and archived (a crash between writing the
  archive and removing the plain copy: ``--repair`` removes the plain copy once
  the archive reads back the same).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from pathlib import Path

from substrat import persistence, start_summary
from substrat.checkpoints import (
    LOG_SHORTER,
    Checkpoint,
    CheckpointStore,
    read_store,
    store_path,
    verify,
)
from substrat.eventlog import LOG_NAME
from substrat.logbase import BASE_NAME, BaseUnreadable, first_kept, read_base
from substrat.logs import USER_DIR
from substrat.segments import (
    ARCHIVE_SUFFIX,
    Segment,
    SegmentDamaged,
    StartUnreadable,
    list_sealed,
    raw_lines,
    read_segment,
    read_start,
    start_path,
)
from substrat.session.store import AGENTS_DIR, RECORD_NAME

Add = Callable[..., None]
"""``report.add(kind, path, severity, detail, *, count=1, repair=None)`` of substrat.fsck."""
DAMAGE, LEFTOVER, NOTICE = "damage", "leftover", "notice"


def log_of(root: Path, endpoint: str) -> Path:
    """The active log file of a checkpoint's endpoint."""
    if endpoint == "user":
        return root / USER_DIR / LOG_NAME
    return root / AGENTS_DIR / endpoint / LOG_NAME


def disagreement(checkpoint: Checkpoint, log_path: Path) -> str | None:
    """Why ``checkpoint`` disagrees with its log (None if it agrees): the entry it names,
    then the length and CRC-32 of the whole prefix before it."""
    reason = verify(checkpoint, log_path)
    if reason is not None:
        return reason
    if first_kept(log_path) > 1:
        return None  # the first segments are missing (reported): nothing to add up
    at = checkpoint.at
    size, crc = 0, 0
    for file_first, offset, raw in raw_lines(log_path):
        size += len(raw)
        crc = zlib.crc32(raw, crc)
        if (file_first, offset) == (at.file_first, at.offset):
            break
    else:
        return f"{LOG_SHORTER} {at.seq}"
    if (size, crc) != (at.prefix_bytes, at.prefix_crc):
        return (
            f"the {size} bytes before and including entry {at.seq} are not the "
            f"{at.prefix_bytes} bytes it summarises (CRC {crc:08x}, not {at.prefix_crc:08x})"
        )
    return None


def inspect(root: Path, add: Add) -> None:
    """Report the findings of the module docstring."""
    path = store_path(root)
    read = read_store(root)
    if read.problem is not None:
        add(
            "unreadable_checkpoints",
            path,
            NOTICE,
            f"{read.problem}; every log is read in full at the next start",
        )
    for kind, count in sorted(read.damage.items()):
        add(
            "checkpoint_damage",
            path,
            LEFTOVER,
            f"{kind} ({count}): those checkpoints are skipped (older ones, or the logs, are "
            "read instead)",
            count=count,
            repair="drop the damaged lines",
        )
    for endpoint, items in sorted(read.checkpoints.items()):
        log_path = log_of(root, endpoint)
        try:
            if not (log_path.exists() or list_sealed(log_path)):
                # the directory went to quarantine, or the log is gone (reported as
                # such): nothing reads this checkpoint
                continue
            why = disagreement(items[-1], log_path)
        except OSError:
            continue  # an unreadable log is reported (and held back) as such
        if why is not None and why.startswith(LOG_SHORTER):
            add(
                "log_behind_checkpoint",
                path,
                DAMAGE,
                f"{os.path.relpath(log_path, root)} is shorter than its checkpoint ({why}): "
                f"entries up to {items[-1].at.seq} were durable in it when the checkpoint was "
                "written and are missing now (an older copy of the log restored, or writes "
                "lost); recovery reads the log as it is",
                repair="drop it; the missing entries are gone (restore a newer copy of the "
                "log first, if there is one)",
            )
        elif why is not None:
            add(
                "checkpoint_mismatch",
                path,
                DAMAGE,
                f"the checkpoint of {os.path.relpath(log_path, root)} at entry "
                f"{items[-1].at.seq} disagrees with the log ({why}); recovery reads that log "
                "in full",
                repair="drop it; recovery writes a new one from the log",
            )


def inspect_summary(root: Path, add: Add) -> None:
    """A start summary that a start would not use (damaged, torn, stale, of another
    format): reported; ``--repair`` rebuilds it from the disk (or removes it)."""
    _, why = start_summary.load(root)
    if why is None:
        return
    path = Path(start_summary.summary_path(root))
    if start_summary.STALE in why:  # a copied or restored root: not damage
        add("start_summary_stale", path, NOTICE, f"{why}; the next start does without it")
        return
    add(
        "start_summary_unusable",
        path,
        LEFTOVER,
        f"{why}; the next start reads the checkpoint store and every record instead",
        repair="rebuild it from the store, the records and the logs (or remove it)",
    )


def unreadable_state(root: Path, session_id: str, path: str) -> str:
    """What a start does with an agent whose file ``path`` it could not use: holds it back,
    unless that file is only its record and the start summary vouches for the agent (a
    clean stop wrote it, and the log is as it then was): a start from the summary does not
    read the record, serves the agent, and writes the record again when its session is
    next suspended (a turn writes no record: ``SessionStore.activate``)."""
    if Path(path).name == RECORD_NAME:
        summary, _ = start_summary.load(root)
        if summary is not None:
            try:
                vouched = summary.record(session_id, path) is not None
            finally:
                summary.close()
            if vouched:
                return (
                    "the next start serves this agent from the start summary (it does not "
                    "read this file) and writes the file again when the agent's session is "
                    "next suspended (evicted, or at a clean stop); a start without the "
                    "summary (after a crash) holds it back"
                )
    return "the daemon holds this agent back"


def inspect_segments(log_path: Path, add: Add) -> None:
    """Sealed segments missing at the start (unless deleted by the policy) or in the
    middle, or there both plain and archived; with none left, entries before the
    active file's start (its start record says where: without one, or with one that
    does not read, a log whose active file starts after entry 1 is not flagged, as its
    first lines may have been damaged and quarantined)."""
    directory = log_path.parent
    sealed = list_sealed(log_path)
    plain = {s.first: s for s in sealed}
    try:
        recorded = read_start(log_path)
    except StartUnreadable as exc:
        recorded = None
        if sealed:
            why, fix = (
                "its segments' names still say where the active file starts",
                ("rewrite it from the segments' names"),
            )
            if not start_path(log_path).is_file():  # a directory: what it holds is kept
                fix = f"move it to quarantine/, then {fix}"
        else:  # nothing else says it: only the user can settle it
            why, fix = (
                "whether entries before the active file's first were lost cannot be told; "
                "restore the log's segments from a backup, or remove it to take the log as "
                "it is",
                None,
            )
        add("damaged_start", start_path(log_path), DAMAGE, f"{exc}: {why}", repair=fix)
    for name in sorted(os.listdir(directory)):
        if name.endswith(".jsonl" + ARCHIVE_SUFFIX):
            twin = directory / name[: -len(ARCHIVE_SUFFIX)]
            if twin.exists():
                add(
                    "segment_archived_twice",
                    twin,
                    LEFTOVER,
                    "archived, but the plain copy was not removed (a crash in between)",
                    repair="remove the plain copy once the archive reads the same",
                )
    expected = 1
    starts = min(plain) if plain else recorded or 1
    if starts > 1:
        deleted = deleted_by_policy(log_path, starts)
        if deleted is not None:
            add("deleted_by_policy", directory, NOTICE, deleted)
            expected = starts
    if not plain and expected < starts:
        add(
            "missing_segment",
            start_path(log_path),
            DAMAGE,
            f"entries {expected}..{starts - 1} are in no segment (its start record says the "
            f"active file starts at entry {starts}): they are lost; restore them from a "
            "backup if there is one",
        )
    for first in sorted(plain):
        segment = plain[first]
        if first != expected:
            add(
                "missing_segment",
                directory / segment.name,
                DAMAGE,
                f"entries {expected}..{first - 1} are in no segment: they are lost; "
                "restore them from a backup if there is one",
            )
        expected = segment.last + 1
    if plain and recorded is not None and recorded > expected:
        add(
            "missing_segment",
            start_path(log_path),
            DAMAGE,
            f"entries {expected}..{recorded - 1} are in no segment (its start record says the "
            f"active file starts at entry {recorded}, after the last sealed segment): they "
            "are lost; restore them from a backup if there is one",
        )


def covered_through(root: Path, log_path: Path) -> int:
    """The last entry of ``log_path`` that a checkpoint agreeing with the log (its whole
    prefix, :func:`disagreement`) covers: the store's newest two, or the log's base;
    0 if none. Entries missing before it were missing when that checkpoint was written,
    and recovery, reading from it, does not count on them."""
    if log_path.parent.parent.name == AGENTS_DIR:
        endpoint = log_path.parent.name
    elif log_path == root / USER_DIR / LOG_NAME:
        endpoint = "user"
    else:
        return 0
    candidates = list(reversed(read_store(root).checkpoints.get(endpoint, [])))
    try:
        base = read_base(log_path)
    except BaseUnreadable:
        base = None
    if base is not None:
        candidates.append(base.checkpoint)
    for checkpoint in sorted(candidates, key=lambda c: -c.at.seq):
        if disagreement(checkpoint, log_path) is None:
            return checkpoint.at.seq
    return 0


def deleted_by_policy(log_path: Path, first: int) -> str | None:
    """What to say of a log whose entries before ``first`` are not there, if the
    ``delete`` compaction policy removed them (its base covers them with a checkpoint
    that holds against the log); None if nothing accounts for them (they are lost)."""
    try:
        base = read_base(log_path)
    except BaseUnreadable:
        return None  # damaged: nothing says what the missing entries held
    if base is None or base.deleted_through < first - 1:
        return None
    if verify(base.checkpoint, log_path) is not None:
        return None
    return (
        f"entries 1-{first - 1} deleted by the compaction policy (delete); their base "
        f"({BASE_NAME}) covers them with the checkpoint at entry {base.checkpoint.at.seq}"
    )


def repair(root: Path, *, lines_lost: bool = False) -> None:
    """Drop damaged and disagreeing checkpoints; finish interrupted archives.

    ``lines_lost``: the repair took entries out of some log (damaged lines). Then
    every checkpoint goes: a sender's checkpoint forgets the messages its turns sent
    once their recipients logged them, so a lost line in another log may have been
    what only the sender's log still says (see :mod:`substrat.recovery`).
    """
    read = read_store(root)
    if read.problem is None and (read.damage or read.checkpoints):
        keep = {
            endpoint: [c for c in items if not lines_lost and _agrees(root, c)]
            for endpoint, items in read.checkpoints.items()
        }
        keep = {e: items for e, items in keep.items() if items}
        if read.damage or keep != read.checkpoints:
            CheckpointStore(root).rewrite(keep)
    for log_path in [*(root / AGENTS_DIR).glob(f"*/{LOG_NAME}"), root / USER_DIR / LOG_NAME]:
        try:
            sealed = list_sealed(log_path)
        except OSError:
            continue  # an unreadable agent is reported as such
        for segment in sealed:
            archive = segment.path.with_name(segment.name + ARCHIVE_SUFFIX)
            if segment.archived or not archive.exists():
                continue
            archived = Segment(segment.first, segment.last, archive)
            try:
                same = read_segment(archived) == read_segment(segment)
            except (OSError, SegmentDamaged):
                same = False
            if same:
                persistence.durable_unlink(segment.path)
    summary = Path(start_summary.summary_path(root))
    if summary.exists() or summary.with_name(summary.name + persistence.TMP_SUFFIX).exists():
        # what it summarised may have changed above: built again from the disk as it is
        persistence.durable_unlink(summary.with_name(summary.name + persistence.TMP_SUFFIX))
        start_summary.write(root)


def _agrees(root: Path, checkpoint: Checkpoint) -> bool:
    log_path = log_of(root, checkpoint.endpoint)
    try:
        return log_path.parent.is_dir() and disagreement(checkpoint, log_path) is None
    except OSError:
        return True  # an unreadable log: nothing tells against its checkpoint
