"""daemon.log's handler on a host that refuses or cuts a line (see daemon_logging)."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from substrat import daemon_logging


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("substrat.daemon", logging.ERROR, __file__, 1, message, None, None)


def test_a_line_cut_short_is_ended_and_counted_once_a_line_gets_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host takes the first 10 bytes of a line, then refuses the rest and the next
    line: the next line that gets through is preceded by the cut line's end and one note
    counting both."""
    path = tmp_path / "daemon.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    handler = daemon_logging.HostTolerantHandler(fd)
    real_write = os.write
    calls = {"n": 0}

    def host(descriptor: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(descriptor, data[:10])  # a short write: the page was full
        if calls["n"] <= 3:  # the rest of the first line, then the second line
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(descriptor, data)

    monkeypatch.setattr(daemon_logging.os, "write", host)
    for message in ("the first line, cut", "the second line", "space again"):
        handler.handle(_record(message))
    os.close(fd)
    assert path.read_text().splitlines() == [
        "the first ",
        "(substrat: 2 log line(s) before this one could not be written: No space left on device)",
        "space again",
    ]
