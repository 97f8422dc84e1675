"""The daemon's own log (``daemon.log``, or stderr with ``--foreground``).

Lines are formatted once here so that credentials carried in URLs never reach
the file: the HTTP client of a provider logs every request's URL, and an
endpoint's URL can hold a proxy's user and password or an ``?api-key=``.
"""

from __future__ import annotations

import logging
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


def configure(level: str) -> None:
    """The daemon's logging: ``level`` and up to stderr, credentials in URLs masked."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
