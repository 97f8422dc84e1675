"""Open event logs, one per endpoint, with a bound on how many stay open.

A root may hold tens of thousands of agents; keeping every log open would run
out of file descriptors, so the least recently used ones are closed and
reopened on demand (reopening repairs, as every open does).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from substrat.agents import USER
from substrat.eventlog import LOG_NAME, Clock, EventLog, utc_now_iso
from substrat.session import SessionStore

MAX_OPEN_LOGS = 256
USER_DIR = "user"


class LogPool:
    """The event log of each endpoint: a session id, or ``"user"``."""

    def __init__(
        self, store: SessionStore, *, clock: Clock = utc_now_iso, max_open: int = MAX_OPEN_LOGS
    ) -> None:
        assert max_open >= 2
        self._store = store
        self._clock = clock
        self._max_open = max_open
        self._open: OrderedDict[str, EventLog] = OrderedDict()

    def path(self, endpoint: str) -> Path:
        if endpoint == USER:
            return self._store.root / USER_DIR / LOG_NAME
        return self._store.log_path(endpoint)

    def get(self, endpoint: str) -> EventLog:
        log = self._open.get(endpoint)
        if log is not None and not log.closed:
            self._open.move_to_end(endpoint)
            return log
        # Not open, or poisoned by a failed write: (re)open, which repairs the tail.
        self._open.pop(endpoint, None)
        if endpoint == USER:
            self._store.make_dir(self.path(USER).parent)
            log = EventLog(self.path(USER), {"endpoint": USER}, clock=self._clock)
        else:
            log = EventLog(self.path(endpoint), {"session_id": endpoint}, clock=self._clock)
        self._open[endpoint] = log
        while len(self._open) > self._max_open:
            _, oldest = self._open.popitem(last=False)
            oldest.close()
        return log

    def close(self, endpoint: str) -> None:
        log = self._open.pop(endpoint, None)
        if log is not None:
            log.close()

    def close_all(self) -> None:
        while self._open:
            _, log = self._open.popitem()
            log.close()
