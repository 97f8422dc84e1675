"""EventLog.log against a raw write + fsync of the same bytes (run: pytest tests/bench).

The pending-file WAL costs a second fsync by design, so the expected ratio is
about 2; anything much above that is overhead worth finding.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from substrat.eventlog import EventLog, encode_entry

DATA = {"prompt": "summarise the design document in three bullet points", "turn_id": 12}


def test_raw_write_fsync(benchmark: Any, tmp_path: Path) -> None:
    line = encode_entry(
        {"seq": 1, "session_id": "s" * 32, "ts": "t" * 32, "event": "turn.start", "data": DATA}
    )
    fd = os.open(tmp_path / "raw.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def raw() -> None:
        os.write(fd, line)
        os.fsync(fd)

    benchmark.group = "eventlog"
    benchmark(raw)
    os.close(fd)


def test_eventlog_log(benchmark: Any, tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl", {"session_id": "s" * 32})
    benchmark.group = "eventlog"
    benchmark(log.log, "turn.start", DATA)
    log.close()
