"""oracle.bench_call_sites charges each faultfs call to the purpose of its innermost
substrat caller, and says where a call no purpose claims came from."""

from __future__ import annotations

from faultfs import FaultFS, _syscalls
from oracle.bench_call_sites import PURPOSES, charging, render, site_of
from substrat.session import Session, SessionState, SessionStore

RECORD, APPEND = PURPOSES[0][0], PURPOSES[1][0]
DIRECTORIES = PURPOSES[-1][0]


def test_the_innermost_frame_that_names_a_purpose_decides() -> None:
    append = ["persistence.py:fsync_fd", "eventlog.py:log", "session/store.py:save"]
    assert site_of(append) == APPEND  # not the record write further out
    made = ["persistence.py:fsync_dir", "persistence.py:durable_mkdir", "session/store.py:save"]
    assert site_of(made) == DIRECTORIES
    assert site_of(["persistence.py:fsync_dir", "session/store.py:save"]) == RECORD


def test_a_call_no_purpose_claims_is_shown_by_its_innermost_caller() -> None:
    assert site_of(["persistence.py:read_bytes", "mystery.py:peek"]) == (
        "other: persistence.py:read_bytes"
    )
    assert site_of([]) == "other: ?"


def test_a_record_save_is_charged_to_the_record_and_its_directory() -> None:
    original = _syscalls.Syscalls.open
    with FaultFS("/call-sites") as fs, charging() as sites:
        store = SessionStore(fs.path("root"))
        session = Session("0" * 31 + "1", provider="scripted", model="m")
        store.save(session)
        store.transition(session, SessionState.ACTIVE)
    assert _syscalls.Syscalls.open is original  # put back
    # each save: the temp file's open, write, fsync and close, the rename, the
    # directory's open, fsync and close
    assert sites[RECORD] >= 2 * 8, sites
    assert sites[DIRECTORIES] >= 3, sites  # the root, agents/, the session's directory
    assert not [site for site in sites if site.startswith("other")], sites
    table = render(sites, 1)
    assert table.splitlines()[0] == f"{sum(sites.values()):,} faultfs calls, " + (
        f"{sum(sites.values()):,} an example"
    )
