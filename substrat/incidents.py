"""Incidents: a loss found in a root, kept on record until an operator acknowledges it.

A log restored from an older backup is shorter than its checkpoint: entries that
were durable in it (acknowledged turns) are gone. Recovery sees it only while the
checkpoint that says so is still in the store; the first clean run writes new
checkpoints that agree with the short log, and ``fsck --repair`` drops the old one,
after which nothing on disk could tell any more. So the first process that finds it
(recovery at any open of the root, or ``fsck --repair``), before either rewrites or
drops a checkpoint, appends an ``incident.recorded`` entry to
``<root>/incidents/events.jsonl`` and returns only once it is fsynced: which
endpoint, its log, how many entries are missing, and where the checkpoint and the
log ended. fsck (``incident_open``: damage), every start (daemon.log, and the
recovery lines of ``daemon start``), ``daemon status`` (human and ``--json``) report
each open incident until ``substrat fsck --acknowledge ID`` appends an
``incident.acknowledged`` entry (fsynced too). An incident's ID is its entry's
``seq``.

The file is an event log (format, writer and durability of an agent's log,
:mod:`substrat.eventlog`): a torn tail is cut at the next append, a damaged line
is skipped and counted, and the rest reads. A damaged record costs that record
only, and is reported (fsck's damaged-line findings, the start's ``log_damage``;
``fsck --repair`` moves it to ``quarantine/`` as any log's): a damaged
acknowledgement reopens its incident (the safe side), a damaged incident record
loses that incident, though the damage itself is said. Recording is idempotent: a
loss (endpoint, checkpoint entry, log end) already on record, acknowledged or not,
is not recorded again, so a crash during recovery, or starts before a new
checkpoint is written, add nothing. A crash before the fsync leaves the
checkpoint that tells it in place, so the next recovery records it then.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from substrat import access, events, paths, persistence
from substrat.checkpoints import LOG_SHORTER, Checkpoint, StoreRead, verify
from substrat.errors import SubstratError
from substrat.eventlog import LOG_NAME, EventLog, read_log
from substrat.fsck_checkpoints import log_of
from substrat.logread import DamageReport, iter_log

INCIDENTS_DIR = "incidents"
LOG_BEHIND = "log_behind_checkpoint"
"""The kind of incident this module records (the only one so far)."""
PARENT_CHAIN_MAX = 64
"""How many parents :func:`agent_path` follows up the tree: deeper than any tree a user
builds by hand, and the end of a loop that damaged logs could make."""


class IncidentError(SubstratError):
    """An acknowledgement that names no incident on record, or an incident log that cannot
    be read or written (a start does not go on without it)."""


def incidents_path(root: str | os.PathLike[str]) -> Path:
    return paths.under(root, INCIDENTS_DIR, LOG_NAME)


@dataclass(frozen=True)
class Behind:
    """A log found shorter than its checkpoint: what an incident records of it."""

    endpoint: str
    log: str
    """The log's path, relative to the root."""
    checkpoint: dict[str, int]
    """Where the checkpoint's last entry is: ``seq``, ``file_first``, ``offset``."""
    checkpoint_crc: str
    log_end: dict[str, int]
    """Where the log ends now: ``last_seq`` (0: no entry reads), ``bytes`` (its active file)."""
    reason: str
    agent: str | None = None
    """The agent's path in the tree (``lead/worker``) as its logs tell it, or None if a log
    on the way does not (an operator knows agents by name, not by session ID)."""

    @property
    def missing(self) -> int:
        """How many entries the checkpoint had that the log does not (at least)."""
        return max(self.checkpoint["seq"] - self.log_end["last_seq"], 0)

    def key(self) -> tuple[str, int, str, int]:
        return (
            self.endpoint,
            self.checkpoint["seq"],
            self.checkpoint_crc,
            self.log_end["last_seq"],
        )

    def to_data(self, found_by: str) -> dict[str, Any]:
        return {
            "kind": LOG_BEHIND,
            "endpoint": self.endpoint,
            "agent": self.agent,
            "log": self.log,
            "missing": self.missing,
            "checkpoint": dict(self.checkpoint),
            "checkpoint_crc": self.checkpoint_crc,
            "log_end": dict(self.log_end),
            "reason": self.reason,
            "found_by": found_by,
        }


def _key_of(data: Mapping[str, Any]) -> tuple[str, int, str, int] | None:
    try:
        return (
            str(data["endpoint"]),
            int(data["checkpoint"]["seq"]),
            str(data["checkpoint_crc"]),
            int(data["log_end"]["last_seq"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def behind(root: str | os.PathLike[str], checkpoint: Checkpoint, reason: str) -> Behind:
    """What an incident records of ``checkpoint``'s log, found shorter than it (``reason``)."""
    log_path = log_of(Path(root), checkpoint.endpoint)
    read = read_log(log_path, known_events=None)
    last = int(read.entries[-1].get("seq", 0)) if read.entries else 0
    try:
        size = os.stat(log_path).st_size
    except FileNotFoundError:
        size = 0
    at = checkpoint.at
    return Behind(
        checkpoint.endpoint,
        os.path.relpath(log_path, root),
        {"seq": at.seq, "file_first": at.file_first, "offset": at.offset},
        at.crc,
        {"last_seq": last, "bytes": size},
        reason,
        agent_path(root, checkpoint.endpoint),
    )


def _created(root: str | os.PathLike[str], session_id: str) -> Mapping[str, Any] | None:
    """The data of the ``agent.created`` entry near the head of the agent's log, if any
    (the first entries only: the log is not read to its end)."""
    damage = DamageReport()
    for entry in iter_log(log_of(Path(root), session_id), damage, known_events=None):
        if entry.get("event") == events.AGENT_CREATED:
            data = entry.get("data")
            return data if isinstance(data, dict) else None
        if int(entry.get("seq", 0)) > 2:  # session.created, then agent.created
            return None
    return None


def agent_path(root: str | os.PathLike[str], session_id: str) -> str | None:
    """``parent/child`` for the agent with ``session_id``, from the ``agent.created`` entry
    of its log and of each parent's; None where one is missing or damaged (the session ID
    is then all an incident can name)."""
    names: list[str] = []
    seen: set[str] = set()
    current: str | None = session_id
    while current is not None and len(names) < PARENT_CHAIN_MAX and current not in seen:
        seen.add(current)
        created = _created(root, current)
        if created is None or not isinstance(created.get("name"), str):
            return None
        names.append(created["name"])
        parent = created.get("parent_session_id")
        current = parent if isinstance(parent, str) else None
    if current is not None:  # a loop, or deeper than the limit
        return None
    return "/".join(reversed(names))


def behind_in_store(root: str | os.PathLike[str], store: StoreRead) -> list[Behind]:
    """Each endpoint whose newest checkpoint in ``store`` finds its log shorter (what
    ``fsck --repair`` records before it drops those checkpoints)."""
    found = []
    for endpoint in sorted(store.checkpoints):
        newest = store.checkpoints[endpoint][-1]
        try:
            reason = verify(newest, log_of(Path(root), endpoint))
            if reason is not None and reason.startswith(LOG_SHORTER):
                found.append(behind(root, newest, reason))
        except OSError:
            continue  # an unreadable log is held back and reported as such, not recorded
    return found


def behind_in_recovery(
    root: str | os.PathLike[str], store: StoreRead, rejected: Mapping[str, str]
) -> list[Behind]:
    """Each endpoint whose newest checkpoint recovery rejected as longer than its log."""
    found = []
    for endpoint, reason in sorted(rejected.items()):
        newest = store.newest(endpoint)
        if newest is not None and reason.startswith(LOG_SHORTER):
            found.append(behind(root, newest, reason))
    return found


@dataclass
class Incident:
    """One recorded incident: its ID (the entry's ``seq``), when, what, and its
    acknowledgement if it has one."""

    id: int
    at: str
    data: dict[str, Any]
    acknowledged: dict[str, Any] | None = None

    def message(self) -> str:
        """What happened and what to do, in one line (no markup)."""
        data = self.data
        checkpoint, end = data.get("checkpoint") or {}, data.get("log_end") or {}
        missing = data.get("missing")
        return (
            f"incident {self.id} ({self.at}): the log of {_who(data)} "
            f"({data.get('log')}) was shorter than its checkpoint: {missing} "
            f"{'entry that was' if missing == 1 else 'entries that were'} durable in it "
            f"missing (the checkpoint had entry {checkpoint.get('seq')}, the log ended at "
            f"entry {end.get('last_seq')}; an older copy of the log restored, or writes "
            "lost). Restore a newer copy of the log if there is one (the daemon stopped), "
            f"then acknowledge it: `substrat fsck --acknowledge {self.id}`"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": self.at,
            **self.data,
            "acknowledged": self.acknowledged,
            "message": self.message(),
        }


def _who(data: Mapping[str, Any]) -> str:
    """The agent an incident is about, by path where it was known (records written before
    the path was kept name the session only)."""
    agent = data.get("agent")
    endpoint = data.get("endpoint")
    return f"agent {agent} (session {endpoint})" if isinstance(agent, str) else f"{endpoint}"


@dataclass
class IncidentsRead:
    """What the incident log holds: every incident by ID, and the damage skipped."""

    incidents: dict[int, Incident] = field(default_factory=dict)
    damage: dict[str, int] = field(default_factory=dict)

    def open(self) -> list[Incident]:
        return [i for _, i in sorted(self.incidents.items()) if i.acknowledged is None]

    def keys(self) -> set[tuple[str, int, str, int]]:
        return {k for i in self.incidents.values() if (k := _key_of(i.data)) is not None}


def read_incidents(root: str | os.PathLike[str]) -> IncidentsRead:
    """Read the incident log without changing anything (none: no incident)."""
    read = IncidentsRead()
    path = incidents_path(root)
    if not os.path.lexists(path):
        return read
    log = read_log(path)
    for entry in log.entries:
        data, seq = entry.get("data"), entry.get("seq")
        if type(data) is not dict or type(seq) is not int:
            continue
        if entry.get("event") == events.INCIDENT_RECORDED:
            read.incidents[seq] = Incident(seq, str(entry.get("ts", "")), data)
        elif entry.get("event") == events.INCIDENT_ACKNOWLEDGED:
            target = read.incidents.get(data.get("id"))  # type: ignore[arg-type]
            if target is not None:
                target.acknowledged = {"at": str(entry.get("ts", "")), **data}
    read.damage = log.damage.counts()
    return read


@contextlib.contextmanager
def _opened(root: str | os.PathLike[str]) -> Iterator[EventLog]:
    """The incident log open for appending. Its open repairs it (a torn tail cut, a
    pending entry replayed), so what is on record is read after it, never before: a
    replayed entry recorded again would be on record twice."""
    path = incidents_path(root)
    persistence.durable_mkdir(path.parent)
    with EventLog(path, {"endpoint": INCIDENTS_DIR}) as log:
        yield log


def record(root: str | os.PathLike[str], found: list[Behind], found_by: str) -> IncidentsRead:
    """Record each loss of ``found`` not on record yet (durably: this returns after the
    fsync), and return the log as it is then."""
    try:
        read = read_incidents(root)
        if found and not {b.key() for b in found} <= read.keys():
            with _opened(root) as log:
                known = read_incidents(root).keys()
                for b in found:
                    if b.key() not in known:
                        log.log(events.INCIDENT_RECORDED, b.to_data(found_by))
                        known.add(b.key())
            read = read_incidents(root)
    except OSError as exc:
        # nothing may go on without it: what comes next rewrites the evidence of a loss,
        # and an incident already on record would go unreported
        raise IncidentError(
            f"the incident log cannot be read or written: {access.failed(exc, then='retry')}"
        ) from exc
    return read


def acknowledge_all(root: str | os.PathLike[str], idents: Iterable[int], by: str) -> list[Incident]:
    """Acknowledge each incident of ``idents`` durably (this returns after the fsync), one
    acknowledged already staying as it is (so a repeat after a crash is harmless), and
    return them; IncidentError, with nothing written, if one is not on record."""
    with _opened(root) as log:
        read = read_incidents(root)
        chosen = []
        for ident in dict.fromkeys(idents):
            incident = read.incidents.get(ident)
            if incident is None:
                on_record = ", ".join(str(i.id) for i in read.open()) or "none"
                raise IncidentError(
                    f"incident {ident} is not on record (open incidents: {on_record}; "
                    "`substrat fsck` lists them)"
                )
            chosen.append(incident)
        for incident in chosen:
            if incident.acknowledged is None:
                log.log(events.INCIDENT_ACKNOWLEDGED, {"id": incident.id, "by": by})
                incident.acknowledged = {"id": incident.id, "by": by}
    return chosen
