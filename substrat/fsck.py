"""``substrat fsck``: an offline check (and repair) of a root.

Without ``repair`` nothing on disk changes: logs are read with ``read_log``,
records with ``SessionStore.scan(quarantine=False)``, the recovery plan with
``recovery.analyze``. The root's lock is held (shared) during the check so a
daemon cannot start halfway through; a root with a running daemon is refused.

What it finds, by severity:

* ``damage``: torn or NUL-padded log tails, damaged lines (bad checksum, bad
  JSON or UTF-8, NUL bytes, duplicate ``seq``), a pending entry that never
  reached its log, corrupt or missing ``session.json``, names under
  ``agents/`` that are not session ids, orphan sessions, unreconciled effects
  of committed turns, unrecoverable sessions, a substrat root made inside this
  one (``nested_root``: reported, never moved; see ``fsck_rootfiles``);
* ``leftover``: harmless debris of an unclean shutdown (a stale pending file,
  a temp file from an interrupted atomic write, a stale socket);
* ``notice``: facts that need no repair (unknown event types written by a
  newer version, records held in ``quarantine/``, an unclean last shutdown,
  unexpected files, a root on a read-only file system).

With ``repair`` (the lock held exclusively): every log is opened with
``EventLog`` (cuts torn tails, replays or drops the pending entry), damaged
lines are moved to ``quarantine/`` and the log rewritten without them
(atomically), corrupt records are quarantined, stray temp files and the stale
socket are removed, bad names are moved to ``quarantine/``, then recovery runs
(the same code the daemon runs at startup: it rebuilds records, terminates
orphans, rolls committed effects forward); sessions it cannot rebuild are moved
to ``quarantine/`` whole.

Exit codes (see :meth:`FsckReport.exit_code`): 0 clean (notices allowed),
1 damage or leftovers found (and repaired, with ``repair``), 2 the check could
not run (no such root, root locked, I/O error).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from substrat import access, fsck_checkpoints, fsck_rootfiles, persistence, recovery_plan
from substrat.access import Unreadable
from substrat.errors import FsckError, RootLockedError
from substrat.eventlog import LOG_NAME, PENDING_NAME, decode_line, read_log
from substrat.facts import collect_facts
from substrat.fsck_repair import repair_root
from substrat.fsck_report import DAMAGE, LEFTOVER, NOTICE
from substrat.fsck_report import EXIT_CLEAN as EXIT_CLEAN
from substrat.fsck_report import EXIT_DAMAGE as EXIT_DAMAGE
from substrat.fsck_report import EXIT_ERROR as EXIT_ERROR
from substrat.fsck_report import Finding as Finding
from substrat.fsck_report import FsckReport as FsckReport
from substrat.incidents import Incident, IncidentError, acknowledge_all
from substrat.logbase import BASE_NAME
from substrat.logread import DAMAGED_ARCHIVE, describe_gaps
from substrat.logs import USER_DIR
from substrat.registry import registry_path
from substrat.root_hold import RootHold
from substrat.rootdir import LEGACY_NAMES
from substrat.rootnest import MARKER_NAME, root_within
from substrat.rpc import lock as root_lock
from substrat.segments import START_NAME, is_segment_name, list_sealed
from substrat.session import SessionState, SessionStore
from substrat.session.store import NESTED_ROOT, QUARANTINE_DIR, RECORD_NAME
from substrat.shellword import shell_word
from substrat.words import plural

_SESSION_FILES = frozenset({RECORD_NAME, LOG_NAME, PENDING_NAME, BASE_NAME, START_NAME})
_ROOT_FILES = frozenset({*LEGACY_NAMES, MARKER_NAME})
THEN = "run `substrat fsck` again"
"""The step after fixing an unreadable agent (see substrat.access)."""
_LINE_DAMAGE = (
    "nul_bytes",
    "invalid_utf8",
    "invalid_json",
    "bad_checksum",
    "missing_checksum",
    "duplicate_seq",
)


_RECOVERS_LATER = "it recovers at the next start"
_RECOVERED_NOW = "this repair recovered it (the next start has nothing to recover)"


def check(
    root: str | os.PathLike[str], *, repair: bool = False, acknowledge: Sequence[int] = ()
) -> FsckReport:
    """Check ``root`` (and repair it if asked), after acknowledging the open incidents
    ``acknowledge`` names (see substrat.incidents). Raises FsckError when it cannot run."""
    path = Path(root).expanduser().absolute()
    if not path.is_dir():
        raise FsckError(f"{path} is not a directory (no substrat root there)")
    if root_lock.is_held(path):
        offline = root_lock.offline_work(path)  # compact, fsck --repair, recover: not stopped
        if offline is not None:
            raise FsckError(offline)
        info = root_lock.read_info(path)
        holder = info.describe() if info is not None else "another process"
        raise FsckError(
            f"{path} is in use by {holder}; fsck checks a stopped root: run "
            f"`substrat daemon stop --root {shell_word(path)}` first"
        )
    release, held = _hold_lock(path, exclusive=repair or bool(acknowledge))
    try:
        hold = RootHold.take(path)  # no orchestrator appends while this looks
    except RootLockedError as exc:
        release()
        raise FsckError(f"{exc}; fsck checks a root nothing has open") from None
    except OSError as exc:
        release()
        raise FsckError(f"cannot check {path}: {access.failed(exc, then='run it again')}") from exc
    try:
        report = FsckReport(str(path), repair)
        if acknowledge:
            report.acknowledged = [i.to_dict() for i in _acknowledge(path, acknowledge)]
        _inspect(path, report)
        report.name_agents()
        if repair and report.problems:
            repair_root(path, report, hold)
            if held is not None:  # recovery ran: the next daemon finds nothing to recover
                held.mark_recovered("substrat fsck --repair")
                for finding in report.findings:
                    if finding.kind == "unclean_shutdown":
                        finding.detail = finding.detail.replace(_RECOVERS_LATER, _RECOVERED_NOW)
            after = FsckReport(str(path), repair)
            _inspect(path, after)
            left = {(f.kind, f.path) for f in after.problems}
            for finding in report.problems:
                finding.repaired = (finding.kind, finding.path) not in left
        return report
    except OSError as exc:
        raise FsckError(f"cannot check {path}: {access.failed(exc, then='run it again')}") from exc
    finally:
        hold.release()
        release()


def _acknowledge(root: Path, idents: Sequence[int]) -> list[Incident]:
    try:
        return acknowledge_all(root, idents, "substrat fsck --acknowledge")
    except IncidentError as exc:
        raise FsckError(str(exc)) from None


def _hold_lock(
    root: Path, *, exclusive: bool
) -> tuple[Callable[[], None], root_lock.RootLock | None]:
    """Keep daemons off the root during the check: the release function, and the
    exclusive lock when one was taken (for repairs)."""
    if exclusive:
        try:
            held = root_lock.RootLock.acquire(root, retry_s=0)
        except RootLockedError as exc:
            raise FsckError(str(exc)) from None
        return held.release, held
    try:
        fd = os.open(root_lock.lock_path(root), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return (lambda: None), None  # a read-only check creates nothing
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise FsckError(f"{root} became busy (a daemon is starting); retry") from None
    return (lambda: os.close(fd)), None


# -- inspection (read-only) ------------------------------------------------------------


def _inspect(root: Path, report: FsckReport) -> None:
    store = SessionStore(root)
    for name in sorted(os.listdir(root)):
        entry = root / name
        if name.endswith(persistence.TMP_SUFFIX):
            report.add(
                "stray_temp",
                entry,
                LEFTOVER,
                "temp file of an interrupted write",
                repair="remove it",
            )
        elif name not in _ROOT_FILES and not root_within(entry):  # a root: reported below
            report.add("unexpected_file", entry, NOTICE, "not part of a substrat root; left alone")
    sock = root / "daemon.sock"
    if os.path.lexists(sock):
        report.add(
            "stale_socket", sock, LEFTOVER, "socket of a daemon that is gone", repair="remove it"
        )
    info = root_lock.read_info(root)
    if info is not None and info.state != "stopped":
        report.add(
            "unclean_shutdown",
            root_lock.lock_path(root),
            NOTICE,
            f"the last daemon (pid {info.pid}) did not shut down cleanly; {_RECOVERS_LATER}",
        )

    scan = store.scan(quarantine=False)
    good, _bad = store.list_dirs()
    report.sessions = len(good)
    for q in scan.quarantined:
        if q.kind == NESTED_ROOT:  # reported, never moved: its daemon may run in it
            report.add("nested_root", store.agents_dir / q.name, DAMAGE, q.reason)
        elif q.kind == "bad_name" or not (store.agents_dir / q.name).is_dir():
            report.add(
                "bad_name",
                store.agents_dir / q.name,
                DAMAGE,
                "not a session directory; ignored by the daemon",
                repair="move to quarantine/",
            )
        else:
            report.add(
                "corrupt_record",
                store.record_path(q.name),
                DAMAGE,
                q.reason,
                repair="move to quarantine/, rebuild from the log",
            )
    for sid in scan.missing_records:
        report.add(
            "missing_record",
            store.record_path(sid),
            DAMAGE,
            "no session.json",
            repair="rebuild from the log (or quarantine the session)",
        )
    unreadable: dict[str, Unreadable] = {}
    ended = {s.session_id for s in scan.sessions if s.state is SessionState.TERMINATED}
    for sid in good:
        directory = store.session_dir(sid)
        if not directory.is_dir():
            continue  # reported above as a bad name: a file where a session should be
        if sid in scan.unreadable:
            continue  # reported with the plan's findings below
        try:
            _inspect_log(directory / LOG_NAME, report, turns=True, live=sid not in ended)
            names = sorted(os.listdir(directory))
        except OSError as exc:  # EACCES, EIO: this session only
            unreadable[sid] = access.unreadable(sid, directory, exc, then=THEN)
            continue
        for name in names:
            if name.endswith(persistence.TMP_SUFFIX):
                report.add(
                    "stray_temp",
                    directory / name,
                    LEFTOVER,
                    "temp file of an interrupted atomic write",
                    repair="remove it",
                )
            elif name not in _SESSION_FILES and not is_segment_name(name):
                report.add("unexpected_file", directory / name, NOTICE, "left alone")
    fsck_rootfiles.inspect_nested_roots(root, report.add, good)
    fsck_rootfiles.inspect_user_log(root, report.add, lambda path: _inspect_log(path, report))
    fsck_rootfiles.inspect_registry(root, report.add, lambda path: _inspect_log(path, report))
    fsck_rootfiles.inspect_incidents(
        root, report.add, partial(_inspect_log, report=report, live=False)
    )
    fsck_checkpoints.inspect(root, report.add)
    fsck_rootfiles.inspect_checkpoint_store(root, report.add)
    fsck_checkpoints.inspect_summary(root, report.add)
    try:
        _inspect_plan(root, report, unreadable)
    except OSError as exc:  # one odd entry must not hide the rest of the report
        # the analysis needs the user's inbox: when that is what failed, it is reported above
        if exc.filename != os.fspath(root / USER_DIR / LOG_NAME) or not _user_log_reported(report):
            report.add(
                "unanalyzable",
                root,
                DAMAGE,
                f"the recovery analysis failed ({exc}); fix the entries above first",
                repair="repair the other findings, then recovery runs",
            )
    quarantine = root / QUARANTINE_DIR
    if quarantine.is_dir():
        held = [n for n in os.listdir(quarantine) if not n.endswith(".reason.json")]
        if held:
            report.add(
                "quarantined",
                quarantine,
                NOTICE,
                f"{plural(len(held), 'item')} held from earlier repairs; inspect, then delete",
                count=len(held),
            )


def _inspect_log(path: Path, report: FsckReport, *, turns: bool = False, live: bool = True) -> None:
    if not path.exists() and not list_sealed(path):
        return
    report.logs += 1
    read = read_log(path)
    fsck_checkpoints.inspect_segments(path, report.add)
    if turns:
        _inspect_turns(path, read.entries, report)
    report.entries += len(read.entries)
    lines: dict[str, dict[str, list[int]]] = {}
    gaps: dict[str, list[tuple[int, int]]] = {}
    for item in read.damage.items:
        if item.kind == "torn_tail":
            torn = path.read_bytes()[item.offset :]
            if torn and not torn.strip(b"\x00"):
                report.add(
                    "nul_padded_tail",
                    path,
                    DAMAGE,
                    f"{item.length} NUL bytes at the end",
                    repair="truncate after the last valid line",
                )
            else:
                report.add(
                    "torn_tail",
                    path,
                    DAMAGE,
                    f"{item.length}-byte partial last line",
                    repair="truncate after the last valid line",
                )
        elif item.kind == "missing_segment":
            continue  # reported by inspect_segments (damage for good: a whole segment lost)
        elif item.missing is not None:
            gaps.setdefault(item.file, []).append(item.missing)
        elif item.kind == DAMAGED_ARCHIVE:
            report.add(
                DAMAGED_ARCHIVE,
                path.with_name(item.file),
                DAMAGE,
                f"its compressed data does not read to the end ({item.excerpt}): the entries "
                "after the damage are lost; restore it from a backup if there is one",
            )
        else:
            lines.setdefault(item.file, {}).setdefault(item.kind, []).append(item.line_no)
    for file, missing in sorted(gaps.items()):
        _report_gaps(report, path, file, missing, live=live)
    for file, kinds in sorted(lines.items()):
        _report_lines(report, path.with_name(file) if file else path, kinds)
    unknown = sorted({str(e.get("event")) for e in read.damage.unknown_events})
    if unknown:
        report.add(
            "unknown_event",
            path,
            NOTICE,
            f"{'event type' if len(unknown) == 1 else 'event types'} {', '.join(unknown)} "
            "from a newer version; kept, skipped",
            count=len(read.damage.unknown_events),
        )
    _inspect_pending(path.with_name(PENDING_NAME), read.entries, report)


def _report_gaps(
    report: FsckReport, path: Path, file: str, missing: list[tuple[int, int]], *, live: bool
) -> None:
    """Entries missing whole from a log's file (``seq_gap``, see substrat.logread).

    Damage while recovery may count on them: a checkpoint of another log may have
    forgotten a message only the missing line still had, so the next start reads every
    log from its start (the repair: recovery does that, rolls forward what the senders'
    logs say, and its clean shutdown writes checkpoints that cover the gap). A notice
    once a checkpoint agreeing with the whole log covers them (they were missing when it
    was written, as ``fsck --repair``'s quarantine leaves them), or when nothing reads
    the log at a start (a terminated agent's, the registry's).
    """
    count = sum(last - first + 1 for first, last in missing)
    cause = (
        "lost with the archive's damaged end"
        if any(f.kind == DAMAGED_ARCHIVE and f.path.endswith(f"/{file}") for f in report.findings)
        else "removed whole, or quarantined by an earlier fsck --repair"
    )
    what = f"{describe_gaps(missing)} ({cause})"
    them = "it" if count == 1 else "them"
    where = path.with_name(file) if file else path
    covered = fsck_checkpoints.covered_through(Path(report.root), path) if live else 0
    if not live or path == registry_path(report.root):
        why = "nothing reads this log at a start"
        report.add("seq_gap", where, NOTICE, f"{what}; {why}", count=count)
    elif covered >= max(last for _, last in missing):
        why = f"the checkpoint at entry {covered}, which agrees with the log, covers {them}"
        report.add("seq_gap", where, NOTICE, f"{what}; {why}", count=count)
    else:
        report.add(
            "seq_gap",
            where,
            DAMAGE,
            f"{what}; no checkpoint covers {them}, so the next start reads every log from "
            f"its start (another log's checkpoint may have forgotten a message only {them} "
            "had)",
            count=count,
            repair="recover from every log in full; the checkpoints written then cover it",
        )


def _report_lines(report: FsckReport, path: Path, lines: dict[str, list[int]]) -> None:
    for kind, numbers in sorted(lines.items()):
        shown = ", ".join(str(n) for n in numbers[:10]) + (" ..." if len(numbers) > 10 else "")
        report.add(
            "damaged_line",
            path,
            DAMAGE,
            f"{kind} at {'line' if len(numbers) == 1 else 'lines'} {shown}",
            count=len(numbers),
            repair="move the lines to quarantine/",
        )


def _inspect_pending(pending: Path, entries: list[dict[str, Any]], report: FsckReport) -> None:
    try:
        raw = persistence.read_bytes(pending)
    except FileNotFoundError:
        return
    line, newline, _rest = raw.partition(b"\n")
    decoded = decode_line(line) if newline else "torn"
    seqs = {e["seq"] for e in entries}
    if isinstance(decoded, dict) and decoded["seq"] not in seqs:
        report.add(
            "pending_unreplayed",
            pending,
            DAMAGE,
            f"entry seq {decoded['seq']} ({decoded.get('event')}) never reached the log",
            repair="append it to the log (it was not acknowledged yet)",
        )
    else:
        why = "already in the log" if isinstance(decoded, dict) else f"unusable ({decoded})"
        if not raw:
            why = "empty"
        report.add("stale_pending", pending, LEFTOVER, f"pending entry {why}", repair="remove it")


def _inspect_turns(path: Path, entries: list[dict[str, Any]], report: FsckReport) -> None:
    """Committed turns whose ``turn.start`` is unreadable (see docs/events.md, Turn ids)."""
    headless = collect_facts(path.parent.name, entries).headless_turns
    if not headless:
        return
    ids = ", ".join(str(t["turn_id"]) for t in headless[:10]) + (
        " ..." if len(headless) > 10 else ""
    )
    if all(t["prompt_kept"] for t in headless):
        report.add(
            "turn_start_lost",
            path,
            NOTICE,
            f"committed turn(s) {ids} have no readable turn.start; nothing is lost "
            "(turn.complete carries the prompt)",
            count=len(headless),
        )
    else:
        report.add(
            "turn_prompt_lost",
            path,
            DAMAGE,
            f"committed turn(s) {ids} have no readable turn.start and their turn.complete "
            "(written by an older version) has no prompt: the history shows them with an "
            "empty prompt; their responses and effects are intact",
            count=len(headless),
        )


def _user_log_reported(report: FsckReport) -> bool:
    return any(f.kind in ("bad_user_log", "unreadable_user_log") for f in report.findings)


def _inspect_plan(root: Path, report: FsckReport, unreadable: dict[str, Unreadable]) -> None:
    store = SessionStore(root)
    plan = recovery_plan.analyze(root, then=THEN)
    if plan.read_only:
        report.add(
            "read_only_root",
            root,
            NOTICE,
            "on a read-only file system: checked without writing; the daemon cannot start "
            "on it and --repair cannot run until it is remounted read-write",
        )
    for item in plan.unreadable:
        unreadable.setdefault(item.session_id, item)
    for sid, item in sorted(unreadable.items()):
        if item.held_by is not None:
            report.add(
                "held",
                store.session_dir(sid),
                NOTICE,
                f"not served while its ancestor {item.held_by} is unreadable; {item.what_to_do}",
            )
        else:
            state = fsck_checkpoints.unreadable_state(root, sid, item.path)
            detail = f"{item.error} on {item.path}: {state}; {item.what_to_do}"
            report.add("unreadable", store.session_dir(sid), DAMAGE, detail)
    for lost in plan.lost_roots:
        report.add("lost_root", lost["path"], DAMAGE, lost["what_to_do"])
    for sid in plan.roots_to_register:
        report.add(
            "unregistered_root",
            registry_path(root),
            LEFTOVER,
            f"live root {sid} is not in the registry (a crash right after its creation, or "
            "a damaged registry line)",
            repair="register it (recovery)",
        )
    for sid in plan.creations_to_rebuild:
        report.add(
            "creation_from_registry",
            store.log_path(sid),
            DAMAGE,
            "this registered root's agent.created is unreadable; recovery takes it from the "
            "registry",
            repair="log agent.created again (recovery)",
        )
    for agent in plan.agents:
        where = store.session_dir(agent.session_id)
        if agent.path is not None:
            report.agents[agent.session_id] = agent.path
            if agent.agent_id is not None:
                report.agent_paths[agent.agent_id] = agent.path
        if agent.status.startswith("orphan"):
            report.add(
                "orphan_session",
                where,
                DAMAGE,
                "live record but no agent.created: a crash during creation",
                repair="terminate it (recovery)",
            )
        elif agent.to_reconcile and (
            agent.status == "live" or agent.status.startswith("record to rebuild")
        ):
            report.add(
                "unreconciled",
                where,
                DAMAGE,
                f"{plural(len(agent.to_reconcile), 'effect')} of committed turns not applied",
                count=len(agent.to_reconcile),
                repair="roll forward (recovery)",
            )
