"""When checkpoints are written, logs rolled into segments and segments compacted.

The policy (:class:`CheckpointPolicy`): an endpoint's log gets a checkpoint
once ``every_entries`` entries or ``every_bytes`` bytes were appended to it
since its last one, when its session is evicted, and at a clean shutdown. An
active file over ``segment_bytes`` is sealed into a segment after a
checkpoint; sealed segments wholly before the newest checkpoint are then kept
(``keep``, the default: the log is the user's record), compressed
(``archive``), or deleted (``delete``: the segments before the one holding the
newest durable checkpoint's entry go, except the newest sealed segment, and
what they held is kept in the log's base first, see :mod:`substrat.logbase`;
the other covered segments are compressed).

**Off the turn's critical path.** :meth:`Checkpointer.appended` is the log's
hook, called once an append's fsync returned: it counts, and when an endpoint
is due it calls :meth:`Checkpointer.poke`, which the orchestrator also calls
after an operation has answered. A poke only takes a capture (where the log
ends, which turns are settled); the building, the append to the store and the
compaction run on a worker thread (``background``), or right there
(``background=False``, deterministic, for the crash fuzzers and tests). Sealing
an active file never happens inside an append (the log being appended to is
open); a seal that a checkpoint made due waits for the next poke outside one.

**Crash rules** (each step through :mod:`substrat.persistence`):

* a checkpoint covers only entries :meth:`EventLog.log` has returned (durable)
  and turns whose effects are applied (settled), so it never runs ahead of
  what recovery would find;
* compaction acts only on checkpoints whose append to the store was fsynced
  (archiving loses nothing either way: a lost checkpoint only makes a restart
  read more; deleting relies on it);
* deleting writes the log's base (the covering checkpoint, the turns of the
  segments going) atomically before it removes a segment, each removal durable
  (:func:`substrat.logbase.delete_covered`);
* sealing renames the active file within its directory (one directory fsync)
  and creates the next one durably; archiving writes the compressed copy
  atomically before removing the plain one (see :mod:`substrat.segments`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from substrat import logbase, segments, start_summary
from substrat.checkpoints import (
    Checkpoint,
    CheckpointStore,
    PositionGone,
    Settled,
    StoreRead,
    build,
    verify,
)
from substrat.conversation import conversation_from_entries
from substrat.errors import DurabilityError
from substrat.eventlog import Clock, utc_now_iso
from substrat.logs import LogPool
from substrat.oserrors import os_error_of, with_advice

log = logging.getLogger("substrat.checkpointer")

COMPACTION_MODES = ("keep", "archive", "delete")


@dataclass(frozen=True)
class CheckpointPolicy:
    """When to checkpoint, roll and compact (see the module docstring)."""

    every_entries: int = 1000
    every_bytes: int = 1 << 20
    on_evict: bool = True
    on_close: bool = True
    segment_bytes: int = 8 << 20
    compaction: str = "keep"
    background: bool = False
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.compaction not in COMPACTION_MODES:
            raise ValueError(
                f"compaction must be one of {', '.join(COMPACTION_MODES)}, not {self.compaction!r}"
            )
        if min(self.every_entries, self.every_bytes, self.segment_bytes) < 1:
            raise ValueError("checkpoint and segment thresholds must be at least 1")

    @classmethod
    def off(cls) -> CheckpointPolicy:
        """No checkpoints, no segments: every start reads every log in full."""
        return cls(enabled=False, on_evict=False, on_close=False)

    @classmethod
    def from_env(cls, env: dict[str, str], *, background: bool = True) -> CheckpointPolicy:
        """The daemon's policy from ``SUBSTRAT_CHECKPOINT_*`` and ``SUBSTRAT_COMPACTION``."""
        if env.get("SUBSTRAT_CHECKPOINTS", "1") == "0":
            return cls.off()
        base = cls()
        return cls(
            every_entries=int(env.get("SUBSTRAT_CHECKPOINT_ENTRIES", base.every_entries)),
            every_bytes=int(env.get("SUBSTRAT_CHECKPOINT_BYTES", base.every_bytes)),
            segment_bytes=int(env.get("SUBSTRAT_SEGMENT_BYTES", base.segment_bytes)),
            compaction=env.get("SUBSTRAT_COMPACTION", base.compaction),
            background=background,
        )


DEFAULT_POLICY = CheckpointPolicy()
"""The policy of an orchestrator given none (frozen, so one is shared by every open)."""


class Host(Protocol):
    """What the checkpointer asks the orchestrator when it takes a capture."""

    def settled(self) -> Settled: ...

    def quiet(self, endpoint: str) -> bool:
        """Whether every committed turn in ``endpoint``'s log is settled right now."""
        ...


@dataclass
class _Task:
    endpoint: str
    path: Path
    previous: Checkpoint | None
    upto_seq: int
    active_end: int
    settled: Settled
    covering: list[Checkpoint] = field(default_factory=list)


@dataclass
class _Done:
    endpoint: str
    written: Checkpoint | None
    error: str | None = None


@dataclass
class Stats:
    """What the checkpointer did in this process (``substrat compact`` reports it)."""

    written: int = 0
    rolled: int = 0
    archived: int = 0
    deleted: int = 0
    failures: int = 0
    errors: list[str] = field(default_factory=list)
    """The newest :data:`KEPT_ERRORS` failures' messages (a daemon runs for months)."""

    def fail(self, message: str) -> None:
        self.failures += 1
        self.errors.append(message)
        del self.errors[:-KEPT_ERRORS]

    def to_dict(self) -> dict[str, object]:
        return {
            "written": self.written,
            "rolled": self.rolled,
            "archived": self.archived,
            "deleted": self.deleted,
            "failures": self.failures,
            "errors": list(self.errors),
        }


KEPT_ERRORS = 5


class Adopted(Protocol):
    """What :meth:`Checkpointer.adopt` takes of recovery's result
    (:class:`substrat.recovery.Recovered`)."""

    checkpointed: dict[str, Checkpoint]
    checkpoints: StoreRead
    summarized: list[str]


class Checkpointer:
    """Writes one root's checkpoints by its policy (see the module docstring)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        logs: LogPool,
        policy: CheckpointPolicy,
        host: Host,
        *,
        clock: Clock = utc_now_iso,
    ) -> None:
        self.policy = policy
        self.store = CheckpointStore(root, clock=clock)
        self._clock = clock
        self.stats = Stats()
        self.summary_unsaved: str | None = None
        """Why the clean stop's start summary could not be written (:meth:`summarize`)."""
        self._logs = logs
        self._host = host
        self._latest: dict[str, list[Checkpoint]] = {}
        """Endpoint -> its durable checkpoints, newest last (at most two); read it through
        :meth:`_kept` (an adopted one may not be built yet: see :meth:`adopt`)."""
        self._unbuilt: set[str] = set()
        self._source: StoreRead = StoreRead()
        self._counts: dict[str, list[int]] = {}
        """Endpoint -> [entries, bytes] appended since its last checkpoint."""
        self._due: set[str] = set()
        self._busy: set[str] = set()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[list[_Done]]] = []
        self._ready = False
        self._in_append = False
        """Inside :meth:`appended`: the log that called it is in the middle of an append."""
        self._roll_due: set[str] = set()
        """Endpoints whose active file a checkpoint made due to seal (at the next poke)."""

    # -- what the orchestrator tells it -------------------------------------------------

    def adopt(self, recovered: Adopted | None = None) -> None:
        """Start from the checkpoints recovery used (each held against its log); the
        other endpoints (all without ``recovered``) start from their log's beginning.

        The checkpoint of an endpoint whose facts came from the start summary is its
        newest in the store recovery read, built when first asked for: a restart of a
        root with many quiet agents builds none (see :mod:`substrat.start_summary`)."""
        if recovered is None:
            self._ready = True
            return
        for endpoint, checkpoint in recovered.checkpointed.items():
            self._latest[endpoint] = [checkpoint]
        if recovered.summarized:
            self._unbuilt.update(recovered.summarized)
            self._source = recovered.checkpoints
        self._ready = True

    def readopt(self, endpoint: str, old: Checkpoint, new: Checkpoint | None) -> None:
        """Recovery took ``old`` for ``endpoint`` and found later that its facts do not read
        (substrat.recovery_user): build on ``new`` (the one the log's read took) instead."""
        latest = self._latest.get(endpoint)
        if latest and latest[-1] is old:
            if new is None:
                del self._latest[endpoint]
            else:
                self._latest[endpoint] = [new]

    def _kept(self, endpoint: str) -> list[Checkpoint] | None:
        """The endpoint's durable checkpoints, newest last (None if it has none)."""
        if endpoint in self._unbuilt:
            self._unbuilt.discard(endpoint)
            newest = self._source.newest(endpoint)
            if newest is not None:
                self._latest[endpoint] = [newest]
        return self._latest.get(endpoint)

    def _all_kept(self) -> dict[str, list[Checkpoint]]:
        for endpoint in list(self._unbuilt):
            self._kept(endpoint)
        return self._latest

    def appended(self, endpoint: str, nbytes: int) -> None:
        """One entry of ``nbytes`` was appended to ``endpoint``'s log (durably)."""
        counts = self._counts.get(endpoint)
        if counts is None:
            counts = self._counts[endpoint] = [0, 0]
        counts[0] += 1
        counts[1] += nbytes
        if counts[0] >= self.policy.every_entries or counts[1] >= self.policy.every_bytes:
            self._due.add(endpoint)
            self._in_append = True
            try:
                self.poke()
            finally:
                self._in_append = False

    def due(self, endpoint: str) -> None:
        """Checkpoint ``endpoint`` at the next :meth:`poke` (an eviction, say)."""
        if self.policy.enabled:
            self._due.add(endpoint)

    def forget(self, endpoint: str) -> None:
        """The endpoint's agent was terminated: no more checkpoints of it."""
        self._due.discard(endpoint)
        self._roll_due.discard(endpoint)
        self._counts.pop(endpoint, None)
        self._latest.pop(endpoint, None)
        self._unbuilt.discard(endpoint)

    def poke(self) -> None:
        """Capture the due endpoints that are quiet and checkpoint them (see the module
        docstring). Call it after an operation answered, never in the middle of one."""
        if not self._in_append:
            for endpoint in sorted(self._roll_due):
                self._maybe_roll(endpoint)
            self._roll_due.clear()
        if not (self.policy.enabled and self._ready and self._due) or self.store.broken:
            return
        settled = self._host.settled()
        tasks = [t for t in (self._capture(e, settled) for e in sorted(self._due)) if t]
        if tasks:
            self._submit(tasks)

    def compact(self, endpoints: list[str]) -> None:
        """Seal the big active files of ``endpoints`` and compact them now, by the policy,
        from their durable checkpoints (a log checkpointed to its end seals into a
        segment its newest checkpoint covers)."""
        for endpoint in endpoints:
            covering = self._kept(endpoint)
            end = self._logs.end(endpoint)
            if covering and end is not None and covering[-1].at.seq >= end.last_seq:
                self._maybe_roll(endpoint)
            if covering and endpoint not in self._busy:
                error = self._compact(self._logs.path(endpoint), covering)
                if error is not None:
                    self.stats.fail(error)

    async def drain(self) -> None:
        """Wait for the checkpoints in progress (background mode)."""
        while self._pending:
            future = self._pending.pop(0)
            done = await asyncio.wrap_future(future)
            self._finish(done)

    async def close(self) -> None:
        """Clean shutdown: checkpoint every endpoint with entries past its checkpoint."""
        await self.drain()
        if self.policy.enabled and self.policy.on_close and self.store.broken is None:
            for endpoint in self._logs.known():
                self._due.add(endpoint)
            self.poke()
            await self.drain()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self.store.close()

    def summarize(self) -> None:
        """Write the start summary (:mod:`substrat.start_summary`) of the store as it is
        now durable: at a clean shutdown only, as its last write (after :meth:`close` and
        every log's close: the next process to write retires it first). Never while a
        checkpoint is being appended."""
        if not (self.policy.enabled and self.policy.on_close) or self.store.broken is not None:
            return
        if self._pending or self._busy:
            return  # a worker may be appending: the next summary covers it
        try:
            start_summary.write(self.store.path.parent.parent)
        except OSError as exc:  # a later start reads the store and the logs as always
            failed = os_error_of(exc)  # the errno's words, not the whole atomic write's
            self.summary_unsaved = (failed.strerror if failed else None) or str(exc)
            self.stats.fail(with_advice(f"writing the start summary: {exc}", exc))
            log.warning("%s", with_advice(f"writing the start summary failed: {exc}", exc))

    # -- capture (the caller's thread), build and append (the worker) ----------------------

    def _capture(self, endpoint: str, settled: Settled) -> _Task | None:
        if endpoint in self._busy or not self._host.quiet(endpoint):
            return None  # tried again at a later poke
        end = self._logs.end(endpoint)
        latest = self._kept(endpoint) or []
        self._due.discard(endpoint)
        if end is None or end.last_seq == 0 or (latest and latest[-1].at.seq >= end.last_seq):
            self._counts.pop(endpoint, None)
            return None
        self._busy.add(endpoint)
        self._counts.pop(endpoint, None)
        return _Task(
            endpoint,
            self._logs.path(endpoint),
            latest[-1] if latest else None,
            end.last_seq,
            end.offset,
            settled,
            list(latest),
        )

    def _submit(self, tasks: list[_Task]) -> None:
        if not self.policy.background:
            self._finish(self._run(tasks))
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="substrat-checkpoints")
        self._pending.append(self._executor.submit(self._run, tasks))
        loop = _running_loop()
        if loop is not None:
            future = self._pending[-1]
            future.add_done_callback(lambda f: loop.call_soon_threadsafe(self._collect, f))

    def _collect(self, future: Future[list[_Done]]) -> None:
        if future in self._pending:
            self._pending.remove(future)
            self._finish(future.result())

    def _run(self, tasks: list[_Task]) -> list[_Done]:
        """Build, append (one fsync for the batch), then compact: the worker's part."""
        built: list[tuple[_Task, Checkpoint]] = []
        out: list[_Done] = []
        for task in tasks:
            try:
                checkpoint = _build(task)
            except (OSError, ValueError) as exc:
                out.append(_Done(task.endpoint, None, with_advice(f"{task.endpoint}: {exc}", exc)))
                continue
            if checkpoint is None:
                out.append(_Done(task.endpoint, None))
            else:
                built.append((task, checkpoint))
        try:
            written = self.store.append([c for _, c in built])
        except DurabilityError as exc:
            said = with_advice(str(exc), exc)
            return out + [_Done(t.endpoint, None, said) for t, _ in built]
        for task, checkpoint in built:
            if not any(c is checkpoint for c in written):
                out.append(_Done(task.endpoint, None, f"{task.endpoint}: checkpoint too large"))
                continue
            covering = [*task.covering, checkpoint][-2:]
            error = self._compact(task.path, covering)
            out.append(_Done(task.endpoint, checkpoint, error))
        return out

    def _compact(self, path: Path, covering: list[Checkpoint]) -> str | None:
        """Archive the sealed segments the durable checkpoints cover (``archive``), or
        delete those the newest lets go and archive the rest (``delete``)."""
        if self.policy.compaction == "keep":
            return None
        try:
            if self.policy.compaction == "delete":
                gone = logbase.delete_covered(
                    path, covering[-1], conversation_from_entries, self._clock
                )
                self.stats.deleted += len(gone)
            for segment in segments.list_sealed(path):
                if not segment.archived and segment.last <= covering[-1].at.seq:
                    segments.archive(segment)
                    self.stats.archived += 1
        except (OSError, ValueError) as exc:  # ValueError: a damaged base (nothing deleted)
            return with_advice(f"compacting {path.parent.name}: {exc}", exc)
        return None

    def _finish(self, done: list[_Done]) -> None:
        """Back on the caller's thread: remember what is durable, seal big active files."""
        for item in done:
            self._busy.discard(item.endpoint)
            if item.error is not None:
                self.stats.fail(item.error)
                log.warning("checkpoint: %s", item.error)
            if item.written is None:
                continue
            self.stats.written += 1
            kept = self._kept(item.endpoint)
            if kept is None:
                kept = self._latest[item.endpoint] = []
            kept.append(item.written)
            del kept[:-2]
            if self._in_append:
                self._roll_due.add(item.endpoint)  # its log is in the middle of an append
            else:
                self._maybe_roll(item.endpoint)
        self._rewrite_store_if_big()

    def _maybe_roll(self, endpoint: str) -> None:
        end = self._logs.end(endpoint)
        if end is None or end.offset < self.policy.segment_bytes or not self._host.quiet(endpoint):
            return
        try:
            if self._logs.roll(endpoint) is not None:
                self.stats.rolled += 1
        except segments.StartNotWritten as exc:  # sealed: only its start record is missing
            self.stats.rolled += 1
            self.stats.fail(with_advice(f"sealing {endpoint}: {exc}", exc))
            log.warning("%s", with_advice(f"sealing a segment of {endpoint}: {exc}", exc))
        except OSError as exc:
            self.stats.fail(with_advice(f"sealing {endpoint}: {exc}", exc))
            log.warning("%s", with_advice(f"sealing a segment of {endpoint} failed: {exc}", exc))

    def _rewrite_store_if_big(self) -> None:
        if self._busy or self.store.broken is not None:
            return  # never while a worker may append
        kept = sum(1 for items in self._latest.values() for _ in items) + len(self._unbuilt)
        if self.store.size < max(REWRITE_MIN_BYTES, 4 * kept * 1024):
            return
        try:
            self.store.rewrite(self._all_kept())
        except OSError as exc:
            self.store.broken = str(exc)
            self.stats.fail(with_advice(f"rewriting the checkpoint store: {exc}", exc))


REWRITE_MIN_BYTES = 4 << 20


def _build(task: _Task) -> Checkpoint | None:
    def from_(previous: Checkpoint | None) -> Checkpoint | None:
        return build(
            task.endpoint,
            task.path,
            previous,
            upto_seq=task.upto_seq,
            active_end=task.active_end,
            settled=task.settled,
        )

    try:
        return from_(task.previous)
    except (PositionGone, ValueError):
        if task.previous is None:
            raise
    # the previous checkpoint's file left the log (or does not read): from the log's
    # base if its first segments were deleted (build refuses a log without its start)
    base = logbase.read_base(task.path)
    if (
        base is not None
        and logbase.first_kept(task.path) > 1
        and verify(base.checkpoint, task.path) is None
    ):
        return from_(base.checkpoint)
    return from_(None)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


Compactor = Callable[[Path], None]
