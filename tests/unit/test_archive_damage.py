"""An archived segment that does not read to its end: its reader stops at the damage."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from substrat.segments import (
    Segment,
    SegmentDamaged,
    archive_damage,
    open_segment,
    read_segment,
    sealed_name,
)

LINES = [b'{"seq":%d,"pad":"%s"}\n' % (i, b"x" * 200) for i in range(1, 401)]


def _archive(tmp_path: Path, cut_to: int | None) -> Segment:
    path = tmp_path / sealed_name(1, len(LINES), archived=True)
    path.write_bytes(gzip.compress(b"".join(LINES), 6, mtime=0))
    if cut_to is not None:
        os.truncate(path, cut_to)
    return Segment(1, len(LINES), path)


def test_a_cut_archive_reads_its_whole_lines_before_the_cut(tmp_path: Path) -> None:
    segment = _archive(tmp_path, 600)
    with open_segment(segment) as handle:
        got = list(handle)
        damage = archive_damage(handle)
    assert damage is not None and "end-of-stream" in damage
    whole = [line for line in got if line.endswith(b"\n")]
    assert 0 < len(whole) < len(LINES) and whole == LINES[: len(whole)]
    with pytest.raises(SegmentDamaged, match=segment.path.name):
        read_segment(segment)


def test_a_whole_archive_reads_as_before(tmp_path: Path) -> None:
    segment = _archive(tmp_path, None)
    with open_segment(segment) as handle:
        assert list(handle) == LINES
        assert archive_damage(handle) is None
    assert read_segment(segment) == b"".join(LINES)
