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
  of committed turns, unrecoverable sessions;
* ``leftover``: harmless debris of an unclean shutdown (a stale pending file,
  a temp file from an interrupted atomic write, a stale socket);
* ``notice``: facts that need no repair (unknown event types written by a
  newer version, records held in ``quarantine/``, an unclean last shutdown,
  unexpected files).

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

import asyncio
import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from substrat import persistence, recovery
from substrat.errors import FsckError, RootLockedError
from substrat.eventlog import LOG_NAME, PENDING_NAME, EventLog, decode_line, read_log
from substrat.logs import USER_DIR
from substrat.rpc import lock as root_lock
from substrat.session import SessionStore
from substrat.session.store import AGENTS_DIR, QUARANTINE_DIR, RECORD_NAME
from substrat.words import plural

EXIT_CLEAN = 0
EXIT_DAMAGE = 1
EXIT_ERROR = 2
DAMAGE, LEFTOVER, NOTICE = "damage", "leftover", "notice"
_SESSION_FILES = frozenset({RECORD_NAME, LOG_NAME, PENDING_NAME})
_ROOT_FILES = frozenset(
    {"daemon.lock", "daemon.sock", "daemon.log", AGENTS_DIR, USER_DIR, QUARANTINE_DIR}
)
_LINE_DAMAGE = (
    "nul_bytes",
    "invalid_utf8",
    "invalid_json",
    "bad_checksum",
    "missing_checksum",
    "duplicate_seq",
)


@dataclass
class Finding:
    """One thing fsck found: what, where (relative to the root), how bad, and the fix."""

    kind: str
    path: str
    severity: str
    detail: str
    count: int = 1
    repair: str | None = None
    """What --repair does about it (None: nothing to do, or nothing fsck can do)."""
    repaired: bool = False
    agent: str | None = None
    """The path of the agent whose files these are (``lead/scout``), when known."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class FsckReport:
    root: str
    repair: bool
    findings: list[Finding] = field(default_factory=list)
    sessions: int = 0
    logs: int = 0
    entries: int = 0
    recovery: dict[str, Any] | None = None
    """With ``repair``: the report of the recovery run at the end."""
    agents: dict[str, str] = field(default_factory=dict)
    """Session id -> agent path (``lead/scout``), so findings can name their agent."""

    def add(
        self,
        kind: str,
        path: Path | str,
        severity: str,
        detail: str,
        *,
        count: int = 1,
        repair: str | None = None,
    ) -> None:
        rel = os.path.relpath(path, self.root) if os.path.isabs(path) else str(path)
        self.findings.append(Finding(kind, rel, severity, detail, count, repair))

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.severity != NOTICE]

    def name_agents(self) -> None:
        """Name each finding's agent from the session id in its path."""
        for finding in self.findings:
            parts = Path(finding.path).parts
            if len(parts) >= 2 and parts[0] == AGENTS_DIR:
                finding.agent = self.agents.get(parts[1])

    def kinds(self, *, include_notices: bool = False) -> dict[str, int]:
        """Count of findings per kind (weighted by ``count``)."""
        tally: dict[str, int] = {}
        for f in self.findings:
            if include_notices or f.severity != NOTICE:
                tally[f.kind] = tally.get(f.kind, 0) + f.count
        return tally

    @property
    def exit_code(self) -> int:
        return EXIT_DAMAGE if self.problems else EXIT_CLEAN

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "repair": self.repair,
            "exit_code": self.exit_code,
            "clean": not self.problems,
            "sessions": self.sessions,
            "logs": self.logs,
            "entries": self.entries,
            "findings": [f.to_dict() for f in self.findings],
            "recovery": self.recovery,
            "agents": dict(self.agents),
        }


def check(root: str | os.PathLike[str], *, repair: bool = False) -> FsckReport:
    """Check ``root`` (and repair it if asked). Raises FsckError when it cannot run."""
    path = Path(root).expanduser().absolute()
    if not path.is_dir():
        raise FsckError(f"{path} is not a directory (no substrat root there)")
    if root_lock.is_held(path):
        info = root_lock.read_info(path)
        holder = info.describe() if info is not None else "another process"
        raise FsckError(
            f"{path} is in use by {holder}; fsck checks a stopped root: run "
            f"`substrat daemon stop --root {path}` first"
        )
    release = _hold_lock(path, exclusive=repair)
    try:
        report = FsckReport(str(path), repair)
        _inspect(path, report)
        report.name_agents()
        if repair and report.problems:
            _repair(path, report)
            after = FsckReport(str(path), repair)
            _inspect(path, after)
            left = {(f.kind, f.path) for f in after.problems}
            for finding in report.problems:
                finding.repaired = (finding.kind, finding.path) not in left
        return report
    except OSError as exc:
        raise FsckError(f"I/O error while checking {path}: {exc}") from exc
    finally:
        release()


def _hold_lock(root: Path, *, exclusive: bool) -> Callable[[], None]:
    """Keep daemons off the root during the check; returns the release function."""
    if exclusive:
        try:
            held = root_lock.RootLock.acquire(root, retry_s=0)
        except RootLockedError as exc:
            raise FsckError(str(exc)) from None
        return held.release
    try:
        fd = os.open(root_lock.lock_path(root), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return lambda: None  # a read-only check creates nothing
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise FsckError(f"{root} became busy (a daemon is starting); retry") from None
    return lambda: os.close(fd)


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
        elif name not in _ROOT_FILES:
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
            f"the last daemon (pid {info.pid}) did not shut down cleanly; "
            "it recovers at the next start",
        )

    scan = store.scan(quarantine=False)
    good, _bad = store.list_dirs()
    report.sessions = len(good)
    for q in scan.quarantined:
        if q.kind == "bad_name" or not (store.agents_dir / q.name).is_dir():
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
    for sid in good:
        directory = store.session_dir(sid)
        if not directory.is_dir():
            continue  # reported above as a bad name: a file where a session should be
        _inspect_log(directory / LOG_NAME, report)
        for name in sorted(os.listdir(directory)):
            if name.endswith(persistence.TMP_SUFFIX):
                report.add(
                    "stray_temp",
                    directory / name,
                    LEFTOVER,
                    "temp file of an interrupted atomic write",
                    repair="remove it",
                )
            elif name not in _SESSION_FILES:
                report.add("unexpected_file", directory / name, NOTICE, "left alone")
    user_log = root / USER_DIR / LOG_NAME
    if user_log.parent.is_dir():
        _inspect_log(user_log, report)
    try:
        _inspect_plan(root, report)
    except OSError as exc:  # one odd entry must not hide the rest of the report
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


def _inspect_log(path: Path, report: FsckReport) -> None:
    if not path.exists():
        return
    report.logs += 1
    read = read_log(path)
    report.entries += len(read.entries)
    lines: dict[str, list[int]] = {}
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
        else:
            lines.setdefault(item.kind, []).append(item.line_no)
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


def _inspect_plan(root: Path, report: FsckReport) -> None:
    store = SessionStore(root)
    for plan in recovery.analyze(root).agents:
        where = store.session_dir(plan.session_id)
        if plan.path is not None:
            report.agents[plan.session_id] = plan.path
        if plan.status.startswith("orphan"):
            report.add(
                "orphan_session",
                where,
                DAMAGE,
                "live record but no agent.created: a crash during creation",
                repair="terminate it (recovery)",
            )
        elif plan.to_reconcile and (
            plan.status == "live" or plan.status.startswith("record to rebuild")
        ):
            report.add(
                "unreconciled",
                where,
                DAMAGE,
                f"{plural(len(plan.to_reconcile), 'effect')} of committed turns not applied",
                count=len(plan.to_reconcile),
                repair="roll forward (recovery)",
            )


# -- repair -----------------------------------------------------------------------------


def _repair(root: Path, report: FsckReport) -> None:
    store = SessionStore(root)
    quarantine = root / QUARANTINE_DIR
    kinds = {f.kind for f in report.problems}
    for finding in report.problems:
        target = root / finding.path
        if finding.kind in ("stray_temp", "stale_socket") and os.path.lexists(target):
            persistence.durable_unlink(target)
            finding.repaired = True
        elif finding.kind == "bad_name" and os.path.lexists(target):
            persistence.durable_mkdir(quarantine)
            persistence.durable_rename(target, _free_name(quarantine, f"bad-name.{target.name}"))
            finding.repaired = True
    if "corrupt_record" in kinds:
        store.scan(quarantine=True)
    logs = [store.log_path(sid) for sid in store.list_dirs()[0]]
    logs.append(root / USER_DIR / LOG_NAME)
    for log_path in logs:
        if log_path.exists() or log_path.with_name(PENDING_NAME).exists():
            EventLog(log_path).close()  # open repairs; close removes the pending file
            _drop_damaged_lines(log_path, quarantine)
    report.recovery = asyncio.run(_recover(root))
    for sid in report.recovery.get("unrecoverable", []):
        directory = store.session_dir(sid)
        if directory.exists():
            persistence.durable_mkdir(quarantine)
            persistence.durable_rename(directory, _free_name(quarantine, f"{sid}.session"))


async def _recover(root: Path) -> dict[str, Any]:
    from substrat.orchestrator import Orchestrator

    orch = await Orchestrator.open(root)
    try:
        report = orch.recovery_report
        return report.to_dict() if report is not None else {}
    finally:
        await orch.close()


def _drop_damaged_lines(log_path: Path, quarantine: Path) -> int:
    """Rewrite a log without its damaged lines, which go to ``quarantine/``."""
    raw = persistence.read_bytes(log_path)
    keep = bytearray()
    dropped = bytearray()
    seen: set[int] = set()
    for piece in raw.split(b"\n")[:-1]:  # after EventLog's repair every line ends in \n
        decoded = decode_line(piece)
        if isinstance(decoded, str) or decoded["seq"] in seen:
            dropped += piece + b"\n"
            continue
        seen.add(decoded["seq"])
        keep += piece + b"\n"
    if not dropped:
        return 0
    persistence.durable_mkdir(quarantine)
    name = f"{log_path.parent.name}.{log_path.name}.damaged"
    persistence.atomic_write(_free_name(quarantine, name), bytes(dropped))
    persistence.atomic_write(log_path, bytes(keep))
    return dropped.count(b"\n")


def _free_name(directory: Path, stem: str) -> Path:
    index = 0
    while os.path.lexists(directory / f"{stem}.{index}"):
        index += 1
    return directory / f"{stem}.{index}"
