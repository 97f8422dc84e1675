from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from substrat import persistence
from substrat.errors import InvalidSessionIdError, InvalidTransitionError, SessionNotFoundError
from substrat.session import Session, SessionState, SessionStore, new_session_id


def _session(**kw: object) -> Session:
    return Session(session_id=new_session_id(), provider="scripted", model="echo", **kw)  # type: ignore[arg-type]


def test_save_load_round_trip_with_blob(root: Path) -> None:
    store = SessionStore(root)
    session = _session(provider_state=b"\x00\xffblob", state_seq=7, agent_id="ab" * 16)
    store.save(session)
    loaded = store.load(session.session_id)
    assert loaded == session
    raw = store.record_path(session.session_id).read_text()
    assert '"provider_state": "AP9ibG9i"' in raw  # base64 on disk


@pytest.mark.parametrize(
    "path",
    [
        [SessionState.ACTIVE, SessionState.SUSPENDED, SessionState.ACTIVE, SessionState.TERMINATED],
        [SessionState.TERMINATED],
        [SessionState.ACTIVE, SessionState.TERMINATED],
    ],
)
def test_valid_transitions_persist(root: Path, path: list[SessionState]) -> None:
    store = SessionStore(root)
    session = _session()
    store.save(session)
    for target in path:
        store.transition(session, target)
        assert store.load(session.session_id).state is target


@pytest.mark.parametrize(
    ("start", "target"),
    [
        (SessionState.CREATED, SessionState.SUSPENDED),
        (SessionState.TERMINATED, SessionState.ACTIVE),
        (SessionState.SUSPENDED, SessionState.CREATED),
        (SessionState.ACTIVE, SessionState.ACTIVE),
    ],
)
def test_invalid_transitions_raise_and_change_nothing(
    root: Path, start: SessionState, target: SessionState
) -> None:
    store = SessionStore(root)
    session = _session(state=start)
    store.save(session)
    with pytest.raises(InvalidTransitionError):
        store.transition(session, target)
    assert session.state is start
    assert store.load(session.session_id).state is start


@pytest.mark.parametrize("bad", ["../etc", "ABCDEF" * 6, "0" * 31, "g" * 32, "", 5])
def test_session_ids_are_validated_before_becoming_paths(root: Path, bad: object) -> None:
    with pytest.raises(InvalidSessionIdError):
        SessionStore(root).session_dir(bad)  # type: ignore[arg-type]


def test_load_missing_raises(root: Path) -> None:
    with pytest.raises(SessionNotFoundError):
        SessionStore(root).load(new_session_id())


def test_corrupt_record_among_good_ones_is_quarantined_and_the_rest_load(root: Path) -> None:
    store = SessionStore(root)
    good = [_session() for _ in range(3)]
    for session in good:
        store.save(session)
    corrupt, truncated, future, flipped = (_session() for _ in range(4))
    for session in (corrupt, truncated, future, flipped):
        store.save(session)
    store.record_path(corrupt.session_id).write_bytes(b"{not json")
    raw = store.record_path(truncated.session_id).read_bytes()
    store.record_path(truncated.session_id).write_bytes(raw[: len(raw) // 2])
    store.record_path(future.session_id).write_text(
        store.record_path(future.session_id).read_text().replace('"version": 1', '"version": 99')
    )
    store.record_path(flipped.session_id).write_text(
        store.record_path(flipped.session_id).read_text().replace('"echo"', '"ech0"')
    )
    (root / "agents" / "not-a-session").mkdir()
    missing = _session()
    store.create_dir(missing.session_id)

    result = store.scan()
    assert sorted(s.session_id for s in result.sessions) == sorted(s.session_id for s in good)
    kinds = {q.name: (q.kind, q.reason) for q in result.quarantined}
    assert kinds[corrupt.session_id][0] == "corrupt"
    assert "version 99" in kinds[future.session_id][1]
    assert "checksum" in kinds[flipped.session_id][1]
    assert kinds[truncated.session_id][0] == "corrupt"
    assert kinds["not-a-session"][0] == "bad_name"
    assert result.missing_records == [missing.session_id]
    # quarantined records were moved aside with a reason file, logs untouched
    moved = sorted(p.name for p in (root / "quarantine").iterdir())
    assert f"{corrupt.session_id}.session.json.0" in moved
    assert f"{corrupt.session_id}.session.json.0.reason.json" in moved
    assert not store.record_path(corrupt.session_id).exists()
    # a second scan no longer sees them and does not fail
    again = store.scan()
    assert len(again.sessions) == 3
    assert {q.kind for q in again.quarantined} == {"bad_name"}


def test_scan_without_quarantine_changes_nothing(root: Path) -> None:
    store = SessionStore(root)
    session = _session()
    store.save(session)
    store.record_path(session.session_id).write_bytes(b"garbage")
    result = store.scan(quarantine=False)
    assert result.quarantined[0].moved_to is None
    assert store.record_path(session.session_id).read_bytes() == b"garbage"
    assert not (root / "quarantine").exists()


def test_recover_flips_active_to_suspended_and_is_idempotent(root: Path) -> None:
    store = SessionStore(root)
    active, suspended, created = _session(), _session(), _session()
    for session, state in (
        (active, SessionState.ACTIVE),
        (suspended, SessionState.SUSPENDED),
        (created, SessionState.CREATED),
    ):
        session.state = state
        store.save(session)
    for _ in range(2):
        result = store.recover()
        states = {s.session_id: s.state for s in result.sessions}
        assert states[active.session_id] is SessionState.SUSPENDED
        assert states[suspended.session_id] is SessionState.SUSPENDED
        assert states[created.session_id] is SessionState.CREATED
    assert store.load(active.session_id).state is SessionState.SUSPENDED


def test_stale_temp_file_is_ignored(root: Path) -> None:
    store = SessionStore(root)
    session = _session()
    store.save(session)
    tmp = store.record_path(session.session_id).with_name("session.json.tmp")
    tmp.write_bytes(b"half a rec")
    assert [s.session_id for s in store.scan().sessions] == [session.session_id]
    store.save(session)
    assert not tmp.exists()


def test_directories_cost_one_fsync_each_once_the_root_is_durable(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The root's whole chain is fsynced once per store; after that a session's
    directory costs what a plain durable mkdir does: one fsync of agents/ (and a
    record's save, nothing more, once the record exists)."""
    synced: list[Path] = []
    real = persistence.fsync_dir

    def spy(path: str | os.PathLike[str]) -> None:
        synced.append(Path(path))
        real(path)

    monkeypatch.setattr(persistence, "fsync_dir", spy)
    store = SessionStore(root)
    store.create_dir("a" * 32)
    assert synced[-2:] == [root, store.agents_dir]  # agents/ is new: its entry, then a's
    assert root.parent in synced, "the root's own entry was not made durable"
    synced.clear()
    store.create_dir("b" * 32)
    assert synced == [store.agents_dir]
    synced.clear()
    session = Session("c" * 32, "scripted", "model-x")
    store.save(session)  # first record: the directory, then the record
    assert synced == [store.agents_dir, store.session_dir("c" * 32)]
    synced.clear()
    store.transition(session, SessionState.ACTIVE)
    assert synced == [store.session_dir("c" * 32)]


def test_scan_reads_records_bigger_than_one_read_and_skips_what_is_no_session(
    root: Path,
) -> None:
    store = SessionStore(root)
    big = Session(new_session_id(), "scripted", "m", provider_state=os.urandom(300_000))
    small = Session(new_session_id(), "scripted", "m")
    for session in (big, small):
        store.save(session)
    assert len(big.to_record()) > 4 * (64 << 10)  # several reads of the record
    (store.agents_dir / ("f" * 32)).write_bytes(b"")  # a file with a session's name
    (store.agents_dir / "notes").mkdir()
    os.symlink(store.session_dir(small.session_id), store.agents_dir / ("e" * 32))
    scan = store.scan(quarantine=False)
    by_id = {s.session_id: s for s in scan.sessions}
    assert by_id[big.session_id].provider_state == big.provider_state
    # a symlink to a session's directory is a directory (its record names the other id)
    assert sorted(q.name for q in scan.quarantined) == sorted(["f" * 32, "notes", "e" * 32])
    assert {q.kind for q in scan.quarantined if q.name != "e" * 32} == {"bad_name"}


_TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)
_INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)


@given(
    agent_id=_TEXT,
    provider=_TEXT,
    model=_TEXT,
    state=st.sampled_from(list(SessionState)),
    state_seq=st.integers(min_value=0, max_value=(1 << 63) - 1),
    blob=st.binary(max_size=64),
    extra=st.one_of(
        st.just({}),
        st.dictionaries(
            _TEXT, st.one_of(_TEXT, _INT64, st.floats(allow_nan=False, allow_infinity=False))
        ),
    ),
)
def test_a_record_is_the_indented_json_it_always_was(
    agent_id: str,
    provider: str,
    model: str,
    state: SessionState,
    state_seq: int,
    blob: bytes,
    extra: dict[str, object],
) -> None:
    """to_record writes what ``json.dumps(body, sort_keys=True, indent=1)`` wrote, byte for
    byte (its own encoder for the common record, json's for any other), with the checksum
    of json's compact sorted form as ever (orjson's form when the bytes are the same),
    and reads back."""
    import json
    import zlib

    session = Session(
        new_session_id(), provider, model, state, blob, state_seq, agent_id, dict(extra)
    )
    record = session.to_record()
    body = json.loads(record)
    assert record == (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()
    crc = body.pop("crc")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    assert crc == f"{zlib.crc32(canonical.encode()):08x}"
    assert Session.from_record(record) == session


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"n": 1 << 64}, "extra.n: 18446744073709551616 does not fit in 64 bits"),
        ({"deep": [{"n": -(1 << 63) - 1}]}, "extra.deep[0].n:"),
        ({"x": float("inf")}, "extra.x: inf is not representable"),
        ({"t": (1, 2)}, "extra.t: tuple is not a plain JSON type"),
    ],
)
def test_an_extra_that_would_not_read_back_is_refused_before_it_is_written(
    root: Path, extra: dict[str, object], named: str
) -> None:
    """orjson reads an integer wider than 64 bits as a float, so such a record came back
    with a checksum mismatch: now the save refuses it, names the value, and writes nothing."""
    store = SessionStore(root)
    session = _session(extra=extra)
    with pytest.raises(TypeError, match=re.escape(named)):
        store.save(session)
    assert not store.record_path(session.session_id).exists()


def test_a_terminated_session_leaves_a_marker_that_only_a_restart_trusts(root: Path) -> None:
    """Once a record says TERMINATED on disk, ``terminated/<id>`` says so too; a restart's
    scan takes the marker instead of reading the record (so it does not see that the
    record went bad since), fsck's and the other readers' scans read every record."""
    store = SessionStore(root)
    live, ended = _session(), _session()
    for session in (live, ended):
        store.save(session)
        store.transition(session, SessionState.ACTIVE)
        store.transition(session, SessionState.SUSPENDED)
    assert not store.terminated_dir.exists(), "a marker for a session that is not terminated"
    store.transition(ended, SessionState.TERMINATED)
    assert sorted(os.listdir(store.terminated_dir)) == [ended.session_id]
    assert store.marked_terminated() == {ended.session_id}
    store.record_path(ended.session_id).write_bytes(b"{damaged")
    restart = store.recover()
    assert restart.terminated == [ended.session_id]
    assert [s.session_id for s in restart.sessions] == [live.session_id]
    assert not restart.quarantined
    full = store.scan(quarantine=False)
    assert full.terminated == []
    assert [q.name for q in full.quarantined] == [ended.session_id]


def test_a_root_without_markers_has_every_record_read(root: Path) -> None:
    """A root an older substrat wrote has no ``terminated/``: a restart reads every
    record, terminated ones too, as before."""
    store = SessionStore(root)
    ended = _session()
    store.save(ended)
    store.transition(ended, SessionState.TERMINATED)
    for name in os.listdir(store.terminated_dir):
        os.unlink(store.terminated_dir / name)
    os.rmdir(store.terminated_dir)
    restart = SessionStore(root).recover()
    assert restart.terminated == []
    assert [(s.session_id, s.state) for s in restart.sessions] == [
        (ended.session_id, SessionState.TERMINATED)
    ]


def test_a_marker_that_cannot_be_made_does_not_undo_the_termination(root: Path) -> None:
    """The marker is a hint: when it cannot be created (here ``terminated`` is a file),
    the termination stands, durable in its record, and a restart reads that record."""
    store = SessionStore(root)
    ended = _session()
    store.save(ended)
    store.terminated_dir.write_bytes(b"")
    store.transition(ended, SessionState.TERMINATED)
    assert ended.state is SessionState.TERMINATED
    assert store.load(ended.session_id).state is SessionState.TERMINATED
    restart = SessionStore(root).recover()
    assert [s.session_id for s in restart.sessions] == [ended.session_id]
