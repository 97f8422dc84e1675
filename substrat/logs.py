"""Open event logs, one per endpoint, with a bound on how many stay open.

A root may hold tens of thousands of agents; keeping every log open would run
out of file descriptors, so the least recently used ones are closed and
reopened on demand. Reopening repairs, as every open does, but only what
follows the position the pool last knew the log to end at (where it closed it,
or where recovery left it): a log's history is not read again for a write.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from substrat import paths, segments
from substrat.agents import USER, AgentNode, AgentState
from substrat.errors import OrchestratorClosedError
from substrat.eventlog import (
    LOG_NAME,
    PAST_THE_SUMMARY,
    Clock,
    EventLog,
    Listed,
    Resume,
    is_suspect,
    utc_now_iso,
)
from substrat.lazy import LazyDict
from substrat.session import SessionStore, validate_session_id
from substrat.session.store import RECORD_NAME

if TYPE_CHECKING:
    from substrat.providers.base import TurnRecord

_log = logging.getLogger(__name__)

MAX_OPEN_LOGS = 256
MAX_KEPT_LOG_BYTES = 8 << 20
"""Recovery keeps the conversations of the logs it reads in full up to this many bytes
of log in all (see :meth:`LogPool.keep_conversation`); past it, a first turn reads
its log as any other restore does."""
USER_DIR = "user"


class LogPool:
    """The event log of each endpoint: a session id, or ``"user"``."""

    def __init__(
        self, store: SessionStore, *, clock: Clock = utc_now_iso, max_open: int = MAX_OPEN_LOGS
    ) -> None:
        assert max_open >= 2
        self._store = store
        self._root_text = os.fspath(store.root)
        self._agents_text = os.fspath(store.agents_dir)
        self._user_log = paths.under(store.root, USER_DIR, LOG_NAME)  # asked per step
        self._clock = clock
        self._max_open = max_open
        self._open: OrderedDict[str, EventLog] = OrderedDict()
        self._ends: LazyDict[str, Resume] = LazyDict(build=_summarized_end)
        """Endpoint -> where its closed log ends; a log the start summary gave is kept as
        (offset, last seq) until asked for (see :meth:`remember_summarized`)."""
        self._kept: dict[str, tuple[tuple[int, int, int, int], list[TurnRecord]]] = {}
        self._kept_bytes = 0
        self.on_append: Callable[[str, int], None] | None = None
        self.closed = False
        """Set by :meth:`close_all`, the orchestrator's last: nothing is written after it."""
        """Told of every durable append (endpoint, bytes): the checkpoint policy counts."""

    def path(self, endpoint: str) -> Path:
        if endpoint == USER:
            return self._user_log
        return self._store.log_path(endpoint)

    def path_text(self, endpoint: str) -> str:
        """:meth:`path` as a string, built without a Path (a restart asks it per agent)."""
        if endpoint == USER:
            return os.path.join(self._root_text, USER_DIR, LOG_NAME)
        return f"{self._agents_text}{os.sep}{validate_session_id(endpoint)}{os.sep}{LOG_NAME}"

    def check_open(self) -> None:
        """Raise OrchestratorClosedError once :meth:`close_all` ended the pool's use."""
        if self.closed:
            raise OrchestratorClosedError(
                "this orchestrator is closed (its hold on the root given back, another may "
                "have it open): open the root again with Orchestrator.open"
            )

    def get(self, endpoint: str, *, fresh: bool = False) -> EventLog:
        """The endpoint's open log, opened (and repaired) if it is not open.

        ``fresh``: the caller created the session's directory just now and it holds the
        session record alone, so the log is created without listing the directory or
        scanning a file known to be empty (the same durable create, fewer reads).
        """
        if self.closed:  # every write of a closed orchestrator would race the next opener's
            self.check_open()
        log = self._open.get(endpoint)
        if log is not None and not log.closed:
            self._open.move_to_end(endpoint)
            return log
        # Not open, or poisoned by a failed write: (re)open, which repairs the tail.
        # A poisoned log's durable end excludes the failed entry (it is cut back).
        stale = self._open.pop(endpoint, None)
        if stale is not None:
            self._ends[endpoint] = stale.resume()
        resume = self._ends.pop(endpoint, None)
        if endpoint == USER:
            self._store.make_dir(self.path(USER).parent)
            context = {"endpoint": USER}
        else:
            context = {"session_id": endpoint}
        hook = self.on_append
        listed = None
        if fresh and stale is None and resume is None and endpoint != USER:
            listed, resume = _FRESH_LISTING, Resume(0, 0)
        log = EventLog(
            self.path(endpoint),
            context,
            clock=self._clock,
            resume=resume,
            on_append=None if hook is None else lambda n: hook(endpoint, n),
            listed=listed,
        )
        if log.report.pending_discarded == PAST_THE_SUMMARY:
            _log.warning(
                "%s: a pending entry put beside the log after the clean stop was set aside, "
                "not replayed (the start served the agent from its start summary)",
                log.path,
            )
        self._open[endpoint] = log
        while len(self._open) > self._max_open:
            oldest_endpoint, oldest = self._open.popitem(last=False)
            self._forget(oldest_endpoint, oldest)
        return log

    def remember(self, endpoint: str, resume: Resume) -> None:
        """Where a closed log ends (recovery read it): the next open starts there."""
        assert endpoint not in self._open, endpoint
        self._ends[endpoint] = resume

    def keep_conversation(
        self, endpoint: str, turns: list[TurnRecord], stat: os.stat_result | None = None
    ) -> None:
        """Hold ``turns``, the conversation recovery's read of the closed log found just
        now (where :meth:`remember` says it ends), for :meth:`kept_conversation`: the
        agent's first turn after the start is restored from it instead of reading the
        whole log again. Kept with the active file's identity (device, inode), size and
        modification time, which say whether anything changed the log since; up to
        :data:`MAX_KEPT_LOG_BYTES` of log in all (the rest read as ever)."""
        end = self._ends.get(endpoint)
        if end is None or self._kept_bytes + end.offset > MAX_KEPT_LOG_BYTES:
            return
        try:  # ``stat``: the repair's own of the file it read, which it did not write
            stamp = _stamp(os.stat(self.path_text(endpoint)) if stat is None else stat)
        except OSError:
            return
        if stamp[2] != end.offset:  # not the file recovery read: nothing to keep
            return
        self._kept[endpoint] = (stamp, turns)
        self._kept_bytes += end.offset

    def kept_conversation(self, endpoint: str) -> list[TurnRecord] | None:
        """The conversation :meth:`keep_conversation` held, once, if the log's active file
        is as it was then; None otherwise (then read the log: ``conversation_from_log``).

        What changes a log changes its active file's stamp: an append grows it (a
        failed one taken back leaves the same bytes), a seal (the first step of every
        compaction and deletion) puts a new file in its place, a repair cuts it or
        appends a pending entry, and a file written or replaced from outside has
        another size, inode or modification time. Closing the log forgets it.
        """
        held = self._kept.pop(endpoint, None)
        if held is None:
            return None
        stamp, turns = held
        try:
            now = _stamp(os.stat(self.path_text(endpoint)))
        except OSError:
            return None
        return turns if now == stamp else None

    def remember_summarized(self, endpoint: str, offset: int, last_seq: int) -> None:
        """As :meth:`remember` of ``Resume(offset, last_seq, summarized=True)``, built
        when first asked for (a start from the summary gives thousands nobody opens)."""
        assert endpoint not in self._open, endpoint
        self._ends.add_source(endpoint, (offset, last_seq))

    def remember_summarized_all(self, ends: dict[str, tuple[int, int]]) -> None:
        """:meth:`remember_summarized` of each endpoint -> (offset, last seq), at once."""
        assert self._open.keys().isdisjoint(ends), "a summarized log is open"
        self._ends.add_sources(ends)

    def end(self, endpoint: str) -> Resume | None:
        """Where the log is known to end (open or closed), if the pool knows."""
        log = self._open.get(endpoint)
        if log is not None and not log.closed:
            return log.resume()
        return self._ends.get(endpoint)

    def known(self) -> list[str]:
        """Every endpoint whose end the pool knows (open, or read since)."""
        return sorted({*self._ends.all_keys(), *self._open})

    def roll(self, endpoint: str) -> segments.Segment | None:
        """Seal the endpoint's active file into a segment (see :mod:`substrat.segments`).

        Only a file that ends where its last durable entry ends is sealed, and not
        one whose failed append is still to be taken back (:func:`is_suspect`: its
        size may show the cut while the disk holds the entry; the next open cuts it
        durably, and would pad a new active file with zeros if it were sealed now); None if
        nothing was sealed.
        """
        log = self._open.pop(endpoint, None)
        if log is not None:
            self._forget(endpoint, log)
        end = self._ends.get(endpoint)
        path = self.path(endpoint)
        if end is None or end.offset == 0 or is_suspect(path):
            return None
        if os.stat(path).st_size != end.offset:
            return None
        first = segments.active_start(path, segments.list_sealed(path))
        if end.last_seq < first:
            return None
        try:
            sealed = segments.roll(path, first, end.last_seq)
        except segments.StartNotWritten:
            self._ends[endpoint] = Resume(0, end.last_seq)  # sealed all the same
            raise
        self._ends[endpoint] = Resume(0, end.last_seq)
        return sealed

    def _forget(self, endpoint: str, log: EventLog) -> None:
        self._ends[endpoint] = log.resume()
        log.close()

    def close(self, endpoint: str) -> None:
        """Close the log; the next open rescans it from the start."""
        log = self._open.pop(endpoint, None)
        self._ends.pop(endpoint, None)
        self._kept.pop(endpoint, None)
        if log is not None:
            log.close()

    def close_all(self) -> None:
        self.closed = True
        while self._open:
            endpoint, log = self._open.popitem()
            self._forget(endpoint, log)


class AgentLog:
    """An agent's log as the pool has it at each write.

    A turn can outlast its log's place in the bounded pool of open logs (other
    agents' writes close the least recently used one), so the log is looked up
    when written, not held. Once the agent is terminated it counts as closed:
    nothing more is written for it.
    """

    def __init__(self, logs: LogPool, node: AgentNode) -> None:
        self._logs = logs
        self._node = node

    @property
    def closed(self) -> bool:
        return self._node.state is AgentState.TERMINATED

    def log(self, event: str, data: Mapping[str, Any] | None = None) -> int:
        return self._logs.get(self._node.session_id).log(event, data)


_FRESH_LISTING: Listed = ([], 1, frozenset({RECORD_NAME}))
"""What a listing of a session directory created just now shows: its record alone (no
sealed segment, no start record, no pending entry, no log yet)."""


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """An active file's device, inode, size and modification time (see kept_conversation)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _summarized_end(endpoint: str, source: tuple[int, int]) -> Resume:
    return Resume(source[0], source[1], True)
