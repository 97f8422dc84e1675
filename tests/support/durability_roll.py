"""The crash contract of sealing a log (:func:`substrat.segments.roll`) right after an
open cut a torn tail off it.

An open's repair cuts a damaged tail without an fsync (the next append's fsync makes
the cut durable with the entry, see :mod:`substrat.eventlog`), and a sealed segment is
never repaired again. A roll that comes before any append (a compaction right after a
recovery) must therefore make the file's cut size durable before the rename exposes it
as a segment: in no crash image may the sealed segment hold the tail again.
Used by tests/stress/test_persistence_fuzz.py.
"""

from __future__ import annotations

import os

from faultfs import FaultFS
from substrat.eventlog import read_log
from substrat.segments import list_sealed, roll
from tests.support.durability import LOG_EVENT, Contract, _entry_data, open_log

TORN_TAIL = b'{"crc":"0badf00d","seq":'
"""An append torn inside its line: no newline, so an open cuts it."""
ROLLED = "rolled"


def roll_after_repair_contract(entries: int) -> Contract:
    """Entries 1..``entries`` and a torn tail, durable; the workload opens the log (the
    repair cuts the tail, unsynced), closes it and seals it at once."""

    def setup(fs: FaultFS) -> None:
        os.makedirs(fs.path("s"))
        log = open_log(fs)
        for seq in range(1, entries + 1):
            log.log(LOG_EVENT, _entry_data(seq, 300))
        log.close()
        with open(fs.path("s", "events.jsonl"), "ab") as handle:
            handle.write(TORN_TAIL)

    def workload(fs: FaultFS) -> None:
        open_log(fs).close()
        roll(fs.path("s", "events.jsonl"), 1, entries)
        fs.ack(ROLLED)

    def check(img: FaultFS) -> None:
        path = img.path("s", "events.jsonl")
        sealed = list_sealed(path)
        if ROLLED in img.acked:
            assert [(s.first, s.last) for s in sealed] == [(1, entries)], (
                f"acknowledged roll not durable: sealed {sealed}"
            )
        open_log(img).close()  # repairs the active file only, as every open does
        read = read_log(path, known_events=None)
        assert read.damage.clean, (
            f"damage after the repair (sealed {[s.name for s in sealed]}): "
            f"{read.damage.counts()} {[d.excerpt for d in read.damage.items]}"
        )
        seqs = [e["seq"] for e in read.entries]
        assert seqs == list(range(1, entries + 1)), f"entries {seqs}, wanted 1..{entries}"

    return Contract(f"roll after a repair, {entries} entries", workload, check, setup)
