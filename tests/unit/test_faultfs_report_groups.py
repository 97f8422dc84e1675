"""A long report reads as the few things to change: causes with one fix form one entry.

dbm.dumb (the standard library's pure-Python dbm) fsyncs nothing and rewrites
its index by renaming it aside: explore finds six causes in three rounds of
open, store and close, most of them the same missing fsync in another file or
at another line. The report's first lines say what to fix first, each
repeated cause becomes one entry listing every cause it holds, and no cause
is dropped.
"""

from __future__ import annotations

import dbm.dumb
import logging
import logging.handlers
import os
import re

from faultfs import ExploreReport, FaultFS, explore

HERE = os.path.dirname(__file__)


def dumb_workload(fs: FaultFS) -> None:
    for i in range(3):
        db = dbm.dumb.open(fs.path("db"), "c")
        db[f"k{i}".encode()] = f"v{i}".encode() * 10
        db.close()
        fs.ack(i)


def dumb_check(img: FaultFS) -> None:
    db = dbm.dumb.open(img.path("db"), "c")
    try:
        for i in img.acked:
            assert db[f"k{i}".encode()] == f"v{i}".encode() * 10
    finally:
        db.close()


def dumb_report() -> ExploreReport:
    return explore(dumb_workload, dumb_check)


def test_dbm_dumb_report_starts_with_what_to_fix_first_and_keeps_every_cause() -> None:
    report = dumb_report()
    causes = report.causes()
    groups = report.cause_groups()
    assert len(causes) >= 5 and len(groups) < len(causes), report.text(HERE)
    assert sorted(repr(c.key) for g in groups for c in g) == sorted(repr(c.key) for c in causes)
    text = report.text(HERE)
    lines = text.splitlines()
    assert lines[2].endswith(f"from {len(causes)} causes ({len(groups)} fixes)"), text
    assert lines[3] == "  fix first (most failing images first):", text
    fixes = lines[4 : 4 + len(groups)]
    counts = [int(re.match(r"    \[\d+\] (\d+) failing images?\b", line)[1]) for line in fixes]  # type: ignore[index]
    assert counts == sorted(counts, reverse=True), text
    directory = "fsync the directory (.) after creating db.dat and db.dir, before anything"
    assert any(directory in line for line in fixes), text
    # one entry per fix, and each cause still named with its own line and count
    entries = [line for line in lines if re.match(r"\[\d+\] ", line)]
    assert len(entries) == len(groups), text
    for cause in causes:
        count = len(cause.failures)
        seen = f"({count} failing image{'s' if count != 1 else ''})"
        assert f"{cause.describe(HERE)[0]} {seen}" in text or (
            f"] {cause.describe(HERE)[0]}" in text
        ), cause.summary


def test_a_report_with_one_cause_has_no_fix_first_list() -> None:
    def setup(fs: FaultFS) -> None:
        with open(fs.path("f"), "wb") as handle:
            handle.write(b"old!")

    def workload(fs: FaultFS) -> None:
        with open(fs.path("f"), "r+b") as handle:
            handle.write(b"new!")
        fs.ack("f")

    def check(img: FaultFS) -> None:
        assert not img.acked or img.read_file("f") == b"new!"

    report = explore(workload, check, setup=setup)
    assert len(report.causes()) == 1, report.text()
    assert len(report.causes()) == len(report.cause_groups()), report.text()
    assert "fix first" not in report.text()


def test_two_fixes_never_read_the_same() -> None:
    """An outsider's shelve (dbm.dumb, one store): the report listed "3 fixes", and the
    first and third said the same words, "fsync sh.dat and sh.dir after writing",
    under the same title, "data never fsynced": the third group is causes whose
    operations were lost together (a write with a rename and a create), which got the
    words of plain unsynced data. Each group now says its own fix."""

    def workload(fs: FaultFS) -> None:
        db = dbm.dumb.open(fs.path("sh"), "c")
        db[b"a"] = b"1"
        db.close()
        fs.ack(1)

    def check(img: FaultFS) -> None:
        db = dbm.dumb.open(img.path("sh"), "c")  # opening for writing is its recovery
        try:
            assert db.get(b"a", b"0") >= str(max(img.acked, default=0)).encode()
        finally:
            db.close()

    report = explore(workload, check)
    groups = report.cause_groups()
    assert "lost-together" in {g[0].kind for g in groups}, report.text(HERE)
    text = report.text(HERE)
    lines = text.splitlines()
    fixes = [re.sub(r"^    \[\d+\] [^:]*: ", "", line) for line in lines[4 : 4 + len(groups)]]
    assert len(set(fixes)) == len(fixes) == len(groups), text
    titles = [line.split(":")[0] for line in lines if re.match(r"\[\d+\] ", line)]
    assert len({re.sub(r"^\[\d+\] ", "", title) for title in titles}) == len(titles), text
    together = next(line for line in fixes if "their directories" in line)
    assert together.startswith("fsync sh.dat and sh.dir, and their directories, before"), text
    assert "] unsynced operations lost together (sh.dat and sh.dir): " in text, text


def test_counts_of_one_read_as_one_image_and_one_fix() -> None:
    # A file created in a new directory, fsynced, acknowledged: two entries never made
    # durable, one fix (fsync the directories), and a power cut at the end is the one
    # image that shows it. The report said "1 failing images ... (1 fixes)".
    def workload(fs: FaultFS) -> None:
        os.mkdir(fs.path("d"))
        with open(fs.path("d/f"), "w") as handle:
            handle.write("x")
            handle.flush()
            os.fsync(handle.fileno())
        fs.ack(1)

    def check(img: FaultFS) -> None:
        if img.acked:
            with open(img.path("d/f")) as handle:
                assert handle.read() == "x"

    report = explore(workload, check, modes=("power",))
    text = report.text(HERE)
    assert len(report.failures) == 1 and len(report.causes()) == 2, text
    assert "  1 failing image (power 1) from 2 causes (1 fix)" in text.splitlines(), text
    assert "failing images" not in text.replace("most failing images first", ""), text


def test_a_rotated_log_s_entries_read_as_created_or_renamed() -> None:
    # logging's RotatingFileHandler fsyncs nothing: its log's create and its renames to
    # audit.log.1 are one fix, which said "after creating audit.log, before anything
    # relies on them": neither the renames nor one file.
    def workload(fs: FaultFS) -> None:
        log = logging.getLogger("s27d-rotated")
        log.propagate = False
        handler = logging.handlers.RotatingFileHandler(
            fs.path("audit.log"), maxBytes=60, backupCount=2
        )
        log.addHandler(handler)
        try:
            for i in range(4):
                log.warning("event %d happened here", i)
                fs.ack(i)
        finally:
            log.removeHandler(handler)
            handler.close()

    def check(img: FaultFS) -> None:
        seen = ""
        for name in ("audit.log.2", "audit.log.1", "audit.log"):
            if os.path.exists(img.path(name)):
                with open(img.path(name)) as handle:
                    seen += handle.read()
        for i in img.acked:
            assert f"event {i} happened" in seen

    text = explore(workload, check).text(HERE)
    assert (
        "fsync the directory (.) after creating or renaming audit.log, before anything relies "
        "on it (each cause below names what did)"
    ) in text, text
