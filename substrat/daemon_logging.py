"""The daemon's own log (``daemon.log``, or stderr with ``--foreground``).

Lines are formatted once here so that credentials carried in URLs never reach
the file: the HTTP client of a provider logs every request's URL, and an
endpoint's URL can hold a proxy's user and password or an ``?api-key=``.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import TextIO

_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#@]+@")
_SECRET_QUERY = re.compile(
    r"(?P<name>[?&](?:api[-_]?key|key|token|access[-_]?token|secret|password|sig|signature)=)"
    r"[^&#\s\"']+",
    re.IGNORECASE,
)
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def redact(line: str) -> str:
    """``line`` with the user and password of every URL, and key-like query values, masked."""
    line = _URL_USERINFO.sub(r"\g<scheme>***@", line)
    return _SECRET_QUERY.sub(r"\g<name>***", line)


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class HostTolerantHandler(logging.StreamHandler):
    """A stream handler that drops a line the host refuses (a full disk, a read-only
    remount) and says so once it can write again.

    The background daemon's stderr is daemon.log itself: logging's own report of the
    failure (``--- Logging error ---`` and a traceback) went to the same full file and
    left a cut traceback there, and the line was lost without a word.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self.dropped = 0
        self.why = ""

    def emit(self, record: logging.LogRecord) -> None:
        if self.dropped:
            try:
                self.stream.write(
                    f"(substrat: {self.dropped} log line(s) before this one could not be "
                    f"written: {self.why})" + self.terminator
                )
                self.flush()
                self.dropped = 0
            except OSError:
                pass  # still refused: this record fails too and is counted
        super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        failed = sys.exc_info()[1]
        if isinstance(failed, OSError):
            self.dropped += 1
            self.why = failed.strerror or str(failed)
            return
        super().handleError(record)


def configure(level: str) -> None:
    """The daemon's logging: ``level`` and up to stderr, credentials in URLs masked."""
    handler = HostTolerantHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
