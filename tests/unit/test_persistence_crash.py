"""The durable primitives keep their promises at every crash point (small, fast cases).

Each contract from tests/support/durability.py is crashed at every I/O boundary
in every faultfs mode (process, power, torn, reorder) on every profile (posix,
ext4-ordered, lazyfs), and fsync failures (EIO) are injected at each fsync.
tests/stress/test_persistence_fuzz.py runs the same contracts on drawn sizes.
"""

from __future__ import annotations

import os

import pytest

from faultfs import MODES, PROFILES, FaultFS
from oracle.faults import failing_fsync
from substrat import persistence
from substrat.errors import DurabilityError, OutcomeUnknownError
from substrat.eventlog import EventLog, read_log
from substrat.session import Session, SessionStore
from tests.support import durability as d
from tests.support import durability_eio as eio

ALL_PROFILES = sorted(PROFILES)

CONTRACTS = [
    d.atomic_write_contract([120, 1300], existing=True),
    d.atomic_write_contract([700], existing=False),
    d.atomic_write_contract([500], retry=True),
    d.mkdir_contract(["a/b/c", "a/d"]),
    d.mkdir_contract(["a/b", "c"], retry=True),
    d.mkdir_contract(["a/a"], retry=True),
    d.create_contract(2),
    d.create_contract(1, retry=True),
    d.unlink_contract(2),
    d.unlink_contract(2, retry=True),
    d.contents_contract(1300, 700),
    d.contents_contract(900, 0, retry=True),
    d.rename_contract(),
    d.eventlog_contract([40, 900, 30, 600], reopen_after=[1]),
    d.eventlog_contract([40, 900, 30], retry=True),
    d.pending_contract(3, 2),
    d.pending_contract(2, 3),
    d.session_contract(1000),
    d.session_contract(300, retry=True),
]
IDS = [c.name for c in CONTRACTS]


@pytest.mark.parametrize("profile", ALL_PROFILES)
@pytest.mark.parametrize("contract", CONTRACTS, ids=IDS)
def test_contract_holds_at_every_crash_point(contract: d.Contract, profile: str) -> None:
    report = contract.explore(profile, images_per_mode=8)
    report.assert_ok()
    # Every boundary was crashed in every mode (identical images are checked once).
    assert report.boundaries >= 4 and report.images_checked >= 3
    assert report.images_checked + report.images_reused >= (report.boundaries + 1) * len(MODES)


@pytest.mark.parametrize("contract", CONTRACTS, ids=IDS)
def test_fsync_failure_is_never_acknowledged(contract: d.Contract) -> None:
    fsyncs = eio.count_fsyncs(contract)
    assert fsyncs >= 1
    markers = eio.marker_fsyncs(contract)
    for nth in range(1, fsyncs + 1):
        outcome = eio.check_fsync_failure(contract, "posix", nth, images_per_mode=4)
        if nth in markers:  # the termination is durable: its marker's failure is no failure
            assert not outcome.raised, f"{contract.name}: EIO on marker fsync #{nth} raised"
        else:
            assert outcome.raised, f"{contract.name}: EIO on fsync #{nth} did not raise"
        assert outcome.images_checked >= len(MODES)


# -- the checks are not blind: without directory fsyncs they fail where they should --


NAMESPACE_CONTRACTS = [
    d.atomic_write_contract([700], existing=False),
    d.mkdir_contract(["a/b"]),
    d.create_contract(1),
    d.unlink_contract(1),
    d.rename_contract(((False, False),)),
]


@pytest.mark.parametrize("contract", NAMESPACE_CONTRACTS, ids=[c.name for c in NAMESPACE_CONTRACTS])
def test_each_directory_fsync_matters_on_posix_and_not_on_lazyfs(
    contract: d.Contract, monkeypatch: pytest.MonkeyPatch
) -> None:
    """posix keeps a new, renamed or removed entry only after its directory's fsync;
    LazyFS passes namespace changes straight to the backing file system."""
    monkeypatch.setattr(persistence, "fsync_dir", lambda path: None)
    posix = contract.explore("posix", modes=("power",), images_per_mode=1)
    assert posix.failures, f"{contract.name}: losing the directory fsync went unnoticed"
    assert {f.phase for f in posix.failures} >= {"end"}, "the acknowledged state must be lost"
    lazy = contract.explore("lazyfs", modes=("power",), images_per_mode=1)
    lazy.assert_ok()


def test_log_without_data_fsync_loses_acknowledged_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = persistence.fsync_fd

    def skip_log_fsync(fd: int, what: object) -> None:
        if not str(what).endswith("events.jsonl"):
            real(fd, what)

    monkeypatch.setattr(persistence, "fsync_fd", skip_log_fsync)
    for profile in ALL_PROFILES:
        report = d.eventlog_contract([40, 50]).explore(profile, modes=("power",))
        assert report.failures, f"{profile}: an unsynced append passed as durable"


# -- EIO semantics, one case spelled out -------------------------------------------------


def _log_with_one_entry(fs: FaultFS) -> EventLog:
    """Inside ``fs``: a durable empty session directory, then a log holding entry 1."""
    os.makedirs(fs.path("s"))
    fs.sync_all()
    log = d.open_log(fs)
    log.log(d.LOG_EVENT, {"n": 1})
    return log


def test_failed_log_fsync_raises_poisons_and_loses_nothing_acknowledged() -> None:
    fs = FaultFS(d.ROOT, "posix")
    with fs:
        log = _log_with_one_entry(fs)
        fs.fail_next_fsync(fs.path("s", "events.jsonl"))
        with pytest.raises(DurabilityError, match="treated as lost"):
            log.log(d.LOG_EVENT, {"n": 2})
        assert log.closed and log.last_seq == 1
    image = fs.crash_image("power")
    with image:
        reopened = d.open_log(image)
        assert reopened.log(d.LOG_EVENT, {"n": "after"}) >= 2
        reopened.close()
        read = read_log(image.path("s", "events.jsonl"), known_events=None)
    assert read.damage.clean
    assert read.entries[0]["data"] == {"n": 1}


def test_append_acknowledged_after_eio_and_reopen_survives_power_loss() -> None:
    fs = FaultFS(d.ROOT, "posix")
    with fs:
        log = _log_with_one_entry(fs)
        fs.fail_next_fsync(fs.path("s", "events.jsonl"))
        with pytest.raises(DurabilityError):
            log.log(d.LOG_EVENT, {"n": 2})
        log = d.open_log(fs)  # "reopen the log (which repairs it) before writing again"
        acked = log.log(d.LOG_EVENT, {"n": 3})
        log.close()
    image = fs.crash_image("power")
    with image:
        d.open_log(image).close()
        read = read_log(image.path("s", "events.jsonl"), known_events=None)
    assert acked in [e["seq"] for e in read.entries], "an acknowledged entry was lost"


def test_two_failed_fsyncs_in_a_row_leave_the_append_undecided_and_the_reopen_clean() -> None:
    """The append's fsync fails, then the one that would take it back: log() says the
    outcome is unknown (not "failed"), and a reopen in the same process cuts the
    bytes only the page cache holds before it appends, so nothing is glued on."""
    fs = FaultFS(d.ROOT, "posix")
    with fs:
        log = _log_with_one_entry(fs)
        with failing_fsync(fs, 1, count=2), pytest.raises(OutcomeUnknownError):
            log.log(d.LOG_EVENT, {"n": 2})
        reopened = d.open_log(fs)
        assert reopened.log(d.LOG_EVENT, {"n": 3}) == 2
        reopened.close()
    for mode in ("process", "power"):
        with fs.crash_image(mode) as image:
            read = read_log(image.path("s", "events.jsonl"), known_events=None)
        assert read.damage.clean, f"{mode}: {read.damage.counts()}"
        assert [e["data"] for e in read.entries] == [{"n": 1}, {"n": 3}], mode


def test_an_undecided_append_that_a_reopen_showed_gone_stays_gone_after_power_loss() -> None:
    """The append's fsync fails after writing the entry back (it is on the disk), and
    the take-back's fsync fails too: undecided. The next open shows the log without
    it, so a power loss afterwards must not bring it back (a restart that has
    settled an undecided turn as lost must not see it committed later)."""
    fs = FaultFS(d.ROOT, "posix")
    with fs:
        log = _log_with_one_entry(fs)
        with failing_fsync(fs, 1, count=2, written=True), pytest.raises(OutcomeUnknownError):
            log.log(d.LOG_EVENT, {"n": 2})
        reopened = d.open_log(fs)
        assert reopened.last_seq == 1
    # the reopen's writes, durable or not, in any subset: the entry's pending copy may
    # have reached the disk by writeback, so the cut and the void must both be durable
    for mode in ("power", "reorder"):
        for image in fs.crash_images(mode, limit=32):
            with image:
                d.open_log(image).close()
                read = read_log(image.path("s", "events.jsonl"), known_events=None)
            assert [e["data"] for e in read.entries] == [{"n": 1}], (
                f"{mode}: the settled entry came back"
            )


# -- a call retried after a failed directory fsync ---------------------------------------


def _retry_after_eio(call: object) -> FaultFS:
    fs = FaultFS(d.ROOT, "posix")
    with fs:
        os.makedirs(fs.path("d"))
        with open(fs.path("d", "f"), "wb") as handle:
            handle.write(b"data")
        fs.sync_all()
        assert callable(call)
        fs.fail_next_fsync(fs.path("d"))
        with pytest.raises(DurabilityError):
            call(fs)
        call(fs)  # the retry returns: acknowledged
    return fs.crash_image("power")


def test_durable_mkdir_retried_after_eio_is_durable() -> None:
    image = _retry_after_eio(lambda fs: persistence.durable_mkdir(fs.path("d", "sub")))
    with image:
        assert os.path.isdir(image.path("d", "sub")), "acknowledged directory lost"


def test_durable_unlink_retried_after_eio_is_durable() -> None:
    image = _retry_after_eio(lambda fs: persistence.durable_unlink(fs.path("d", "f")))
    with image:
        assert not os.path.exists(image.path("d", "f")), "acknowledged removal undone"


def test_durable_create_retried_after_eio_is_durable() -> None:
    image = _retry_after_eio(lambda fs: persistence.durable_create(fs.path("d", "new")))
    with image:
        assert os.path.exists(image.path("d", "new")), "acknowledged file lost"


def test_atomic_write_retried_after_eio_is_durable() -> None:
    image = _retry_after_eio(lambda fs: persistence.atomic_write(fs.path("d", "f"), b"new"))
    with image:
        assert persistence.read_bytes(image.path("d", "f")) == b"new"


# -- a directory left visible but not durable by a failed (or killed) call ---------------
#
# The call that created it raised before its parent's fsync, so the directory is
# in the page cache only; whatever relies on it later must make its entry durable.


def test_durable_mkdir_under_a_directory_left_by_a_failed_call_is_durable() -> None:
    fs = FaultFS(d.ROOT, "posix")
    with fs:
        os.makedirs(fs.path("home"))
        fs.sync_all()
        fs.fail_next_fsync(fs.path("home"))
        with pytest.raises(DurabilityError):
            persistence.durable_mkdir(fs.path("home", "agents", "s1"))
        assert os.path.isdir(fs.path("home", "agents")), "the failed call left it visible"
        assert persistence.durable_mkdir(fs.path("home", "agents", "s2")) is True
    image = fs.crash_image("power")
    with image:
        assert os.path.isdir(image.path("home", "agents", "s2")), "acknowledged directory lost"


def test_durable_mkdir_of_a_directory_left_two_levels_up_is_durable() -> None:
    """The gap is not only the parent: every visible level's entry must be made durable."""
    fs = FaultFS(d.ROOT, "posix")
    with fs:
        fs.fail_next_fsync(fs.root)
        with pytest.raises(DurabilityError):
            persistence.durable_mkdir(fs.path("home"))
        os.mkdir(fs.path("home", "agents"))
        persistence.fsync_dir(fs.path("home"))  # "agents" is durable in home; home is not
        assert persistence.durable_mkdir(fs.path("home", "agents")) is False
    image = fs.crash_image("power")
    with image:
        assert os.path.isdir(image.path("home", "agents")), "acknowledged directory lost"


def test_session_save_over_a_directory_left_by_a_failed_save_is_durable() -> None:
    fs = FaultFS(d.ROOT, "posix")
    session = Session(d.SESSION_ID, "scripted", "model-x", agent_id="a" * 32)
    with fs:
        store = SessionStore(fs.root)
        os.makedirs(store.agents_dir)
        fs.sync_all()
        fs.fail_next_fsync(store.agents_dir)
        with pytest.raises(DurabilityError):
            store.save(session)
        assert os.path.isdir(store.session_dir(d.SESSION_ID)), "the failed save left it visible"
        store.save(session)  # the retry returns: acknowledged
    image = fs.crash_image("power")
    with image:
        loaded = SessionStore(image.root).load(d.SESSION_ID)
        assert loaded.to_record() == session.to_record(), "acknowledged record lost"


def test_session_save_under_a_root_left_by_a_failed_call_is_durable() -> None:
    """A store fsyncs only from its root down once it made the root durable; the
    first time, the root's own entry is made durable too (it may be left by a
    call that failed, as here)."""
    fs = FaultFS(d.ROOT, "posix")
    session = Session(d.SESSION_ID, "scripted", "model-x", agent_id="a" * 32)
    with fs:
        fs.fail_next_fsync(fs.root)
        with pytest.raises(DurabilityError):
            persistence.durable_mkdir(fs.path("home"))
        SessionStore(fs.path("home")).save(session)
    image = fs.crash_image("power")
    with image:
        loaded = SessionStore(image.path("home")).load(d.SESSION_ID)
        assert loaded.to_record() == session.to_record(), "acknowledged record lost"


def test_session_save_retried_after_eio_is_durable() -> None:
    """The retry form of the session contract, with EIO on each fsync in turn."""
    contract = d.session_contract(300, retry=True)
    assert contract.setup is None, "the retried first save must start from a bare root"
    markers = eio.marker_fsyncs(contract)
    assert markers, "the contract ends with a termination, which leaves a marker"
    for nth in range(1, eio.count_fsyncs(contract) + 1):
        outcome = eio.check_fsync_failure(contract, "posix", nth, images_per_mode=2)
        assert outcome.raised is (nth not in markers)


@pytest.mark.parametrize("outside", ["passthrough", "refuse"])
def test_durable_mkdir_stops_at_the_root_of_a_simulated_file_system(outside: str) -> None:
    """Above a FaultFS root there is nothing of ours (there, its real parent does not
    even exist): the walk up ends at the root instead of failing on what lies above."""
    fs = FaultFS("/substrat-no-such-parent/root", "posix", outside=outside)
    with fs:
        assert persistence.durable_mkdir(fs.path("a")) is True
        assert persistence.durable_mkdir(fs.path("a", "b")) is True
        assert persistence.durable_mkdir(fs.path("a", "b")) is False
    image = fs.crash_image("power")
    with image:
        assert os.path.isdir(image.path("a", "b"))
