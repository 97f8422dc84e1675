"""A roll seals what the active file holds on the disk, not only what it shows.

Found by the crash fuzzer (checkpoints-lazyfs): a torn crash left a damaged
tail on the disk, recovery's repair cut it without an fsync (the next append's
fsync makes such a cut durable), the next checkpoint rolled the file into a
sealed segment before any append, and a power loss right after the rename
brought the cut tail back inside the segment, where nothing repairs it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from faultfs import FaultFS
from substrat import persistence
from substrat.agents import USER
from substrat.errors import OutcomeUnknownError
from substrat.eventlog import EventLog, is_suspect, read_log, repair_log
from substrat.logs import LogPool
from substrat.segments import list_sealed, roll
from substrat.session import SessionStore

TOP = "/segment-roll-durability"


def _torn_tail_on_disk(log: Path) -> None:
    """What a torn crash in an append leaves durably: part of a line, then zeros."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        persistence.write_all(fd, b'{"crc":"' + bytes(40))
        persistence.fsync_fd(fd, log)
    finally:
        os.close(fd)


@pytest.mark.parametrize("profile", ["lazyfs", "posix"])
def test_a_tail_cut_by_a_repair_stays_cut_in_the_sealed_segment(profile: str) -> None:
    fs = FaultFS(TOP, profile)
    log = Path(TOP, "agent", "events.jsonl")
    with fs:
        persistence.durable_mkdir(log.parent)
        with EventLog(log) as writer:
            for i in range(3):
                writer.log("x", {"i": i})
        _torn_tail_on_disk(log)
        report = repair_log(log)  # recovery's repair: the cut is not fsynced
        assert report.truncated_bytes > 0 and report.last_seq == 3
        sealed = roll(log, 1, report.last_seq)
    with fs.crash_image("power"):  # a power loss just after the roll
        assert [s.name for s in list_sealed(log)] == [sealed.name]
        assert bytes(40) not in sealed.path.read_bytes()
        read = read_log(log, known_events=None)  # the segment, then the empty active file
        assert read.damage.clean, read.damage.counts()
        assert [e["seq"] for e in read.entries] == [1, 2, 3]


def test_a_failed_append_not_yet_taken_back_is_not_sealed() -> None:
    """Its take-back cut the file but could not fsync the cut, so the next open of the
    log cuts it again, durably. Sealed meanwhile, that open would meet the new, empty
    active file and durably pad it with zeros to the old one's length."""
    fs = FaultFS(TOP, "lazyfs")
    with fs:
        pool = LogPool(SessionStore(Path(TOP, "root")))
        log = pool.path(USER)
        for i in range(3):
            pool.get(USER).log("x", {"i": i})
        durable_end = os.stat(log).st_size
        fs.fail_next_fsync(log, errno.EIO)  # the append's fsync
        fs.fail_next_fsync(log, errno.EIO)  # the take-back's
        with pytest.raises(OutcomeUnknownError):
            pool.get(USER).log("x", {"i": "failed"})
        assert is_suspect(log) and os.stat(log).st_size == durable_end  # the cut shows
        assert pool.roll(USER) is None  # a checkpoint now
        pool.get(USER)  # the next open: it takes the entry back
        assert not is_suspect(log)
    with fs.crash_image("power"):  # a power loss before the next append
        read = read_log(log, known_events=None)
        assert read.damage.clean, read.damage.counts()
        assert [e["data"]["i"] for e in read.entries] == [0, 1, 2]
    with fs:
        assert pool.roll(USER) is not None  # taken back: it seals
        assert pool.get(USER).log("x", {"i": 3}) == 4
        pool.close_all()
        assert [e["seq"] for e in read_log(log, known_events=None).entries] == [1, 2, 3, 4]
