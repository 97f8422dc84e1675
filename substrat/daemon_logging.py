"""The daemon's own log (``daemon.log``, or stderr with ``--foreground``).

Lines are formatted once here so that credentials carried in URLs never reach
the file: the HTTP client of a provider logs every request's URL, and an
endpoint's URL can hold a proxy's user and password or an ``?api-key=``.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys

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


class HostTolerantHandler(logging.Handler):
    """Each line written to a descriptor with ``os.write``; a line the host refuses (a
    full disk, a read-only remount) is counted and said once a line gets through.

    The background daemon's stderr is daemon.log itself, so logging's own report of a
    refused line (``--- Logging error ---`` and a traceback) went into the same full file,
    cut. And Python's text stream cannot be trusted to report a refusal at all: with
    PYTHONUNBUFFERED its stderr writes to the file unbuffered and drops the rest of a
    short write without an error (a line cut after its first 10 bytes, then nothing).
    Every short write is seen here, the remainder retried, and its refusal counted.
    """

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd
        self.refused = 0
        """Lines lost (wholly or cut short) since the last line that got through."""
        self.cut = False
        """The last bytes written end a cut line: the next must start a new one."""
        self.why = ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
        except Exception:
            self.handleError(record)  # a bug's traceback, not the host's refusal
            return
        if self.refused:
            note = (
                f"(substrat: {self.refused} log line(s) before this one could not be "
                f"written: {self.why})\n"
            )
            if not self._put((("\n" if self.cut else "") + note).encode()):
                self.refused += 1  # this record's line was not tried: lost too
                return
            self.refused = 0
        if not self._put(line):
            self.refused += 1

    def _put(self, data: bytes) -> bool:
        """Write all of ``data``; False (and the refusal noted) if the host refused it."""
        written = 0
        try:
            while written < len(data):
                done = os.write(self.fd, data[written:])
                if not done:  # never for a file; a loop forever if it were
                    raise OSError(errno.EIO, "the write took no byte")
                written += done
        except OSError as exc:
            self.cut = self.cut or written > 0
            self.why = exc.strerror or str(exc)
            return False
        self.cut = False
        return True


def configure(level: str) -> None:
    """The daemon's logging: ``level`` and up to stderr, credentials in URLs masked."""
    handler: logging.Handler
    try:
        sys.stderr.flush()
        handler = HostTolerantHandler(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):  # a stderr without a descriptor
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
