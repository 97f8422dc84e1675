"""The lines a log's read splits its file into (substrat.logread.file_lines): the same as
iterating the file as a binary file object, whatever the chunks' edges cut."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substrat import logread
from substrat.eventlog import EventLog, read_log

# newlines, carriage returns (no line end for a binary file) and other bytes, in runs
_PIECES = st.lists(
    st.sampled_from([b"\n", b"\r", b"\r\n", b"x", b"{}", b"yz" * 7, b"\x00"]), max_size=40
)


@settings(max_examples=200, deadline=None)
@given(pieces=_PIECES, chunk=st.integers(1, 9), offset=st.integers(0, 30))
def test_the_lines_are_a_binary_file_objects_lines(
    tmp_path_factory: pytest.TempPathFactory, pieces: list[bytes], chunk: int, offset: int
) -> None:
    data = b"".join(pieces)
    path = tmp_path_factory.mktemp("lines") / "events.jsonl"
    path.write_bytes(data)
    with open(path, "rb") as handle:
        handle.seek(offset)
        want = list(handle)
    fd = os.open(path, os.O_RDONLY)
    try:
        saved, logread.READ_CHUNK = logread.READ_CHUNK, chunk
        try:
            got = list(logread.file_lines(fd, offset))
            sized = list(logread.file_lines(fd, offset, len(data)))
        finally:
            logread.READ_CHUNK = saved
    finally:
        os.close(fd)
    assert got == want
    assert sized == want


def _log_of(path: Path, entries: int, width: int = 0) -> None:
    """A log of ``entries`` notes, the i-th with a text of ``width * i`` bytes."""
    with EventLog(path) as log:
        for i in range(entries):
            log.log("note", {"i": i, "text": "w" * (width * i)})


def _counting_preads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The descriptors of every ``os.pread`` a log's read makes from now on."""
    reads: list[int] = []
    real = os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        reads.append(fd)
        return real(fd, n, offset)

    monkeypatch.setattr(logread.os, "pread", pread)
    return reads


@pytest.mark.parametrize("entries", [0, 1, 3])
def test_a_log_smaller_than_a_chunk_is_read_in_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entries: int
) -> None:
    """The reads stop at the size the open's fstat gave: no read past it to find the end
    (a read by path, a repair through the descriptor it appends with, the checkpoint
    store's read). An empty file is still read once: a read that fails fails."""
    from substrat.checkpoints import read_store, store_path
    from substrat.eventlog import repair_log

    path = tmp_path / "events.jsonl"
    _log_of(path, entries)
    store = store_path(tmp_path)
    store.parent.mkdir()
    store.write_bytes(path.read_bytes())
    reads = _counting_preads(monkeypatch)
    read = read_log(path, known_events=None)
    assert [e["data"]["i"] for e in read.entries] == [*range(entries)]
    assert len(reads) == 1
    assert repair_log(path).last_seq == entries
    assert len(reads) == 2
    assert read_store(tmp_path).last_seq == entries
    assert len(reads) == 3


def test_a_log_of_many_chunks_is_read_to_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One read per chunk, the last one ending at the file's size; every entry read."""
    path = tmp_path / "events.jsonl"
    _log_of(path, 9, 10)
    size = path.stat().st_size
    monkeypatch.setattr(logread, "READ_CHUNK", 64)
    reads = _counting_preads(monkeypatch)
    assert [e["data"]["i"] for e in read_log(path, known_events=None).entries] == [*range(9)]
    assert len(reads) == -(-size // 64)


def test_a_directory_in_a_logs_place_fails_as_opening_it_did(tmp_path: Path) -> None:
    """``open`` refused a directory at once, naming it; the read says the same."""
    where = tmp_path / "events.jsonl"
    where.mkdir()
    with pytest.raises(IsADirectoryError) as raised:
        read_log(where)
    assert raised.value.filename == str(where)


def test_a_log_read_across_chunk_edges_reads_every_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries longer than a chunk, cut anywhere, read back whole and in order."""
    path = tmp_path / "events.jsonl"
    _log_of(path, 5, 30)
    with open(path, "ab") as handle:
        handle.write(b'{"crc":"0000')  # a torn tail
    whole = read_log(path, known_events=None)
    monkeypatch.setattr(logread, "READ_CHUNK", 7)
    cut = read_log(path, known_events=None)
    assert [e["data"]["i"] for e in cut.entries] == [0, 1, 2, 3, 4]
    assert cut == whole
    assert cut.damage.counts() == {"torn_tail": 1}


def test_a_directory_in_the_checkpoint_stores_place_is_its_problem(tmp_path: Path) -> None:
    """As when the store was opened with ``open``: a problem naming it, not an exception."""
    from substrat.checkpoints import read_store, store_path

    store_path(tmp_path).mkdir(parents=True)
    read = read_store(tmp_path)
    assert (
        read.problem
        == f"{store_path(tmp_path)}: [Errno 21] Is a directory: '{store_path(tmp_path)}'"
    )
    assert read.checkpoints == {}
