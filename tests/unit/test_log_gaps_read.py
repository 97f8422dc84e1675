"""The readers see a line removed whole (a ``seq`` gap), and nothing else as one."""

from __future__ import annotations

from pathlib import Path

from substrat.eventlog import EventLog, Resume, read_log, repair_log
from substrat.segments import roll, write_start


def _log(path: Path, count: int) -> list[bytes]:
    with EventLog(path) as log:
        for i in range(count):
            log.log("note", {"i": i})
    return path.read_bytes().splitlines(keepends=True)


def _gaps(path: Path) -> list[tuple[int, int]]:
    return read_log(path, known_events=None).damage.gaps()


def test_a_healthy_log_has_no_gap(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _log(path, 5)
    assert _gaps(path) == [] and read_log(path, known_events=None).damage.clean


def test_lines_removed_whole_from_the_middle_are_gaps(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = _log(path, 8)
    path.write_bytes(b"".join(lines[:2] + lines[3:5] + lines[7:]))  # 3, 6 and 7 removed
    read = read_log(path, known_events=None)
    assert read.damage.gaps() == [(3, 3), (6, 7)]
    assert read.damage.counts() == {"seq_gap": 3}
    assert [e["seq"] for e in read.entries] == [1, 2, 4, 5, 8]


def test_the_first_line_removed_is_a_gap_unless_the_start_record_says_it_starts_later(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.jsonl"
    lines = _log(path, 4)
    path.write_bytes(b"".join(lines[2:]))
    assert _gaps(path) == [(1, 2)]
    write_start(path, 3)  # the log starts at entry 3 by design (its segments gone)
    assert _gaps(path) == []
    path.write_bytes(lines[3])  # and now entry 3 is gone too
    assert _gaps(path) == [(3, 3)]


def test_a_damaged_line_may_hold_the_missing_seq(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = _log(path, 5)
    damaged = bytearray(lines[2])
    damaged[len(damaged) // 2] ^= 0x01
    path.write_bytes(b"".join([*lines[:2], bytes(damaged), *lines[3:]]))
    counts = read_log(path, known_events=None).damage.counts()
    assert counts == {"bad_checksum": 1}, counts  # the damage, not a gap as well
    path.write_bytes(b"".join([*lines[:1], bytes(damaged), *lines[3:]]))  # and 2 removed
    assert _gaps(path) == [(2, 3)]


def test_a_torn_tail_and_a_duplicate_are_no_gap(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = _log(path, 4)
    path.write_bytes(b"".join([*lines, lines[1], lines[3][:10]]))
    kinds = read_log(path, known_events=None).damage.counts()
    assert kinds == {"duplicate_seq": 1, "torn_tail": 1}, kinds


def test_a_sealed_segment_says_where_it_ends(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = _log(path, 4)
    segment = roll(path, 1, 4)
    _log(path, 2)
    assert _gaps(path) == []
    segment.path.write_bytes(b"".join(lines[:3]))  # its last line removed
    read = read_log(path, known_events=None)
    assert read.damage.gaps() == [(4, 4)]
    assert read.damage.items[0].file == segment.name


def test_a_read_from_a_checkpoint_checks_only_what_follows_it(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = _log(path, 6)
    path.write_bytes(b"".join(lines[:1] + lines[2:4] + lines[5:]))  # 2 and 5 removed
    after = len(lines[0]) + len(lines[2]) + len(lines[3])  # a checkpoint at entry 4
    report = repair_log(path, resume=Resume(after, 4))
    assert report.damage.gaps() == [(5, 5)]
    assert report.kept_damage().gaps() == [(5, 5)] and report.whole_lines_cut() == 0
