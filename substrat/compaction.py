"""Compacting a stopped root: what ``substrat compact`` shows (``--dry-run``) and does.

A running daemon compacts by its own policy (``SUBSTRAT_COMPACTION``, default
``keep``: see :mod:`substrat.checkpointer`). ``substrat compact`` does it once,
offline, with the root's lock held: recovery runs (as at a daemon start), every
log gets a checkpoint, every active file over ``segment_bytes`` is sealed and
checkpointed again, and the sealed segments the checkpoints cover are archived
(gzip: nothing is lost), or, with ``compaction="delete"``, deleted as far as
:func:`substrat.logbase.deletable` lets them go (their turns and the covering
checkpoint kept in the log's base first) and the rest archived. :func:`plan`
says what that would do without changing anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from substrat import access, events
from substrat.checkpointer import CheckpointPolicy
from substrat.checkpoints import StoreRead, read_store, verify
from substrat.errors import FsckError, RootLockedError
from substrat.eventlog import LOG_NAME
from substrat.logbase import BaseUnreadable, LogBase, deletable, read_base
from substrat.logread import DamageReport, iter_log
from substrat.logs import USER_DIR
from substrat.segments import list_sealed, stored_bytes
from substrat.session.store import AGENTS_DIR
from substrat.shellword import shell_word


@dataclass
class LogPlan:
    """One endpoint's log and what compaction would do to it."""

    endpoint: str
    name: str | None
    active_bytes: int
    sealed: int
    archived: int
    stored_bytes: int
    checkpoint_seq: int | None
    """The newest checkpoint that holds against the log (None: none does)."""
    to_archive: list[str] = field(default_factory=list)
    to_delete: list[str] = field(default_factory=list)
    deleted_through: int = 0
    """Entries 1..this were deleted by an earlier ``delete`` compaction (0: none)."""
    unreadable: str | None = None
    """Why the log could not be read, and what to do (it is skipped, left as it is)."""
    to_seal: bool = False
    """The active file is at ``segment_bytes`` or over: compacting seals it into a segment,
    checkpoints it and then archives it (the newest sealed segment is never deleted)."""
    path: str | None = None
    """The agent's path of names (``lead/kid``, a terminated agent's as it was), as other
    commands name agents; ``user`` for the user's log; None when no ``agent.created``
    of it is read."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class CompactPlan:
    logs: list[LogPlan]

    @property
    def stored_bytes(self) -> int:
        return sum(p.stored_bytes for p in self.logs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stored_bytes": self.stored_bytes,
            "logs": [p.to_dict() for p in self.logs],
        }


def _logs(root: Path) -> list[tuple[str, Path]]:
    found = [(USER_DIR, root / USER_DIR / LOG_NAME)]
    agents = root / AGENTS_DIR
    if agents.is_dir():
        found += [(name, agents / name / LOG_NAME) for name in sorted(os.listdir(agents))]
    return [(e, p) for e, p in found if p.exists() or _has_segments(p)]


def _has_segments(log_path: Path) -> bool:
    try:
        return bool(list_sealed(log_path))
    except OSError:
        return True  # its directory does not list: planned, and reported as unreadable


def plan(
    root: str | os.PathLike[str],
    *,
    compaction: str = "archive",
    segment_bytes: int | None = None,
) -> CompactPlan:
    """What compacting ``root`` with ``compaction`` (``archive`` or ``delete``) and
    ``segment_bytes`` (default: the policy's) would do now, from the checkpoints there are.

    Reads only. An active file at ``segment_bytes`` or over is to be sealed
    (``to_seal``); other segments a checkpoint does not cover yet (what follows the
    newest checkpoint) are left alone; ``compact`` checkpoints every log first, so
    it may do more than this shows, never less.
    """
    _check_mode(compaction)
    limit = segment_bytes or CheckpointPolicy().segment_bytes
    root = Path(root)
    store = read_store(root)
    out = CompactPlan([])
    created: dict[str, dict[str, Any]] = {}
    for endpoint, log_path in _logs(root):
        try:
            item, created[endpoint] = _plan_log(store, endpoint, log_path, compaction, limit)
            out.logs.append(item)
        except OSError as exc:  # one log's EACCES/EIO costs that log: skipped, reported
            item = LogPlan(endpoint, None, 0, 0, 0, 0, None)
            held = access.unreadable(endpoint, log_path.parent, exc, then=THEN)
            todo = held.what_to_do.removesuffix("; nothing of it was changed")
            item.unreadable = f"{held.error} on {held.path}: {todo}"
            out.logs.append(item)
    for item in out.logs:
        item.path = USER_DIR if item.endpoint == USER_DIR else _path(item.endpoint, created)
    return out


def _path(endpoint: str, created: dict[str, dict[str, Any]]) -> str | None:
    """``lead/kid`` from each log's ``agent.created`` (its parent's session, up to a root);
    ``?`` stands for a parent whose log says nothing of it."""
    data = created.get(endpoint)
    if not data:
        return None
    names, seen = [str(data.get("name"))], {endpoint}
    parent = data.get("parent_session_id")
    while parent:
        above = created.get(str(parent))
        if not above or str(parent) in seen:
            names.append("?")
            break
        seen.add(str(parent))
        names.append(str(above.get("name")))
        parent = above.get("parent_session_id")
    return "/".join(reversed(names))


THEN = "run `substrat compact` again"


def _plan_log(
    store: StoreRead, endpoint: str, log_path: Path, compaction: str, limit: int
) -> tuple[LogPlan, dict[str, Any]]:
    """The log's plan, and its ``agent.created`` (empty if none is read)."""
    holding = [c for c in store.latest(endpoint) if verify(c, log_path) is None]
    sealed = list_sealed(log_path)
    try:
        active = os.stat(log_path).st_size
    except FileNotFoundError:
        active = 0
    try:
        base = read_base(log_path)
    except BaseUnreadable:
        base = None
    created: dict[str, Any] = {}
    if holding:
        with contextlib.suppress(ValueError):
            created = holding[0].load_facts().created or {}
    if not created and endpoint != USER_DIR:  # no checkpoint holds: the log says
        created = _created(log_path, base)
    item = LogPlan(
        endpoint,
        created.get("name"),
        active,
        sum(1 for s in sealed if not s.archived),
        sum(1 for s in sealed if s.archived),
        stored_bytes(log_path),
        holding[0].at.seq if holding else None,
    )
    item.deleted_through = 0 if base is None else base.deleted_through
    item.to_seal = active >= limit
    going = deletable(sealed, holding[0]) if holding and compaction == "delete" else []
    if item.to_seal and compaction == "delete":
        # Sealed and checkpointed, the active file becomes the newest segment, holding
        # the log's checkpoint: every segment before it may then go.
        going = sealed
    item.to_delete = [s.name for s in going]
    for segment in sealed:
        if segment in going:
            continue
        if not segment.archived and holding and segment.last <= holding[0].at.seq:
            item.to_archive.append(segment.name)
    return item, created


def _created(log_path: Path, base: LogBase | None) -> dict[str, Any]:
    """A log's ``agent.created``: from its base when it has one (the ``delete`` policy
    removed the lines before it), else from its first lines; empty if neither says."""
    try:
        facts = None if base is None else base.checkpoint.load_facts()
    except ValueError:  # the log's own lines may still say
        facts = None
    if facts is not None and facts.created:
        return facts.created
    for entry in iter_log(log_path, DamageReport()):
        if entry.get("event") == events.AGENT_CREATED:
            data = entry.get("data")
            return data if isinstance(data, dict) else {}
    return {}


@dataclass
class CompactReport:
    checkpoints: int
    sealed: int
    archived: int
    deleted: int
    bytes_before: int
    bytes_after: int
    errors: list[str]
    recovery: dict[str, Any] | None = None
    """What the recovery compact ran first found, as a daemon start reports it
    (``previous_shutdown``, ``report``, ``names``): set when the last daemon died or the
    recovery did something; None when there was nothing to say."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _check_mode(compaction: str) -> None:
    if compaction not in ("archive", "delete"):
        raise ValueError(f"compaction must be 'archive' or 'delete', not {compaction!r}")


def compact(
    root: str | os.PathLike[str],
    *,
    segment_bytes: int | None = None,
    compaction: str = "archive",
) -> CompactReport:
    """Compact a stopped root now (see the module docstring). FsckError if a daemon runs."""
    from substrat.rootdir import check_inbox_not_a_root
    from substrat.rpc.lock import RootLock

    _check_mode(compaction)
    root = Path(root)
    check_inbox_not_a_root(root, "compact")
    base = CheckpointPolicy()
    policy = CheckpointPolicy(
        compaction=compaction,
        segment_bytes=segment_bytes or base.segment_bytes,
        background=False,
    )
    try:
        held = RootLock.acquire(root, retry_s=0)
    except RootLockedError:
        raise FsckError(_in_use(root)) from None
    try:
        planned = plan(root)
        stats, recovery = asyncio.run(_compact(root, policy))
        # Recovered offline, as `substrat recover` marks it: the next daemon says so
        # instead of reporting a crash whose report this command has already given.
        held.mark_recovered("substrat compact")
        after = plan(root).stored_bytes
    finally:
        held.release()
    from substrat.daemon import as_reported

    recovery["report"] = as_reported(recovery["report"], held.previous_shutdown)
    notable = _notable(recovery["report"])
    recovery["previous_shutdown"] = held.previous_shutdown
    skipped = [
        f"{where(item.endpoint)} compacted only as far as it reads: {item.unreadable}"
        for item in planned.logs
        if item.unreadable is not None
    ]
    return CompactReport(
        int(stats["written"]),
        int(stats["rolled"]),
        int(stats["archived"]),
        int(stats["deleted"]),
        planned.stored_bytes,
        after,
        list(dict.fromkeys([*skipped, *stats["errors"]])),  # each said once
        recovery if held.previous_shutdown == "unclean" or notable else None,
    )


def _in_use(root: Path) -> str:
    """Why compact will not run on a root in use, and what to do (another root is no
    answer: it is this root that is to be compacted)."""
    from substrat.rpc import lock

    offline = lock.offline_work(root)  # another compact, fsck --repair, recover
    if offline is not None:
        return offline
    info = lock.read_info(root)
    if info is None or info.state != "running" or info.pid is None:
        return (
            f"{root} is in use by another substrat process (fsck, recover, compact or a "
            f"starting daemon); run `substrat compact --root {shell_word(root)}` again once it "
            "is done"
        )
    return (
        f"{root} is in use by {info.describe()}; compact needs a stopped root: run "
        f"`substrat daemon stop --root {shell_word(root)}`, then `substrat compact --root "
        f"{shell_word(root)}` again (`--dry-run` works while it serves; a running daemon "
        "compacts by its own policy, SUBSTRAT_COMPACTION)"
    )


def _notable(report: dict[str, Any]) -> bool:
    from substrat.daemon import NOTABLE_RECOVERY_KEYS  # what a daemon's start reports too

    return any(report.get(key) for key in NOTABLE_RECOVERY_KEYS)


def where(endpoint: str) -> str:
    return f"{USER_DIR}/{LOG_NAME}" if endpoint == USER_DIR else f"{AGENTS_DIR}/{endpoint}"


async def _compact(root: Path, policy: CheckpointPolicy) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checkpointer's counts, and the recovery the open ran (its report, and agent id ->
    path for naming the agents in it)."""
    from substrat.orchestrator import Orchestrator

    orch = await Orchestrator.open(root, checkpoints=policy)
    report = orch.recovery_report
    recovery = {
        "report": report.to_dict() if report is not None else {},
        "names": {node.agent_id: orch.tree.path(node.agent_id) for node in orch.tree.walk()},
    }
    try:
        await orch.checkpoint()  # every log; the big active files are sealed after it
        # A Ctrl-C cancels this task, which takes effect at its next await; the offline
        # checkpointer's work has none in it, so without these a Ctrl-C could be swallowed
        # (the run finishing as if it never came) or not, depending on what close awaits.
        await asyncio.sleep(0)
        await orch.checkpoint()  # and the segments just sealed are covered (and compacted)
        await asyncio.sleep(0)
    finally:
        await orch.close()
    return orch.checkpointer.stats.to_dict(), recovery
