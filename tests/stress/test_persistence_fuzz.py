"""Persistence fuzzer: every durable primitive, every crash point, every mode and profile.

Hypothesis draws the shape of each workload (payload sizes across block
boundaries, how many calls, where the log is reopened, which renames cross
directories or replace a file, the faultfs block size and image seed);
``faultfs.explore`` then crashes it at every boundary and checks every image of
every mode against the primitive's contract (tests/support/durability.py).
A second family injects EIO at a drawn fsync, and at the ones after it (a
failed append, then the clean-up that takes it back, then the reopen), with
the pages dropped or, as writeback may race the error, already on the disk:
the call must raise DurabilityError and stop, or (in the ``retry`` forms) be
retried once in the same process, the log after a reopen; every crash image
afterwards must still keep every promise that was acknowledged, the retried
call's included, and an append reported as failed must never appear.

The drawn tests take the Hypothesis profile's ``max_examples`` (50 under
``ci``, 5000 under ``nightly``), the drawn contracts shared by ``DRAWN_SHARDS``
items a profile; the whole file runs in seconds under ``ci``.
"""

from __future__ import annotations

import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import seed as fixed_seed
from hypothesis import strategies as st

from faultfs import MODES, PROFILES
from oracle.shards import examples_per_shard
from oracle.sweep import quiet_runtime
from tests.support import durability as d
from tests.support import durability_eio as eio
from tests.support import durability_roll as roll

pytestmark = pytest.mark.stress

ALL_PROFILES = sorted(PROFILES)
IMAGES_PER_MODE = 16

block_sizes = st.sampled_from([512, 4096])
# Sizes that land on, just before and just after 512-byte blocks, and inside one.
sizes = st.one_of(
    st.integers(0, 3000),
    st.sampled_from([1, 511, 512, 513, 1023, 1024, 1025, 2048, 4095, 4096, 4097]),
)


@quiet_runtime()  # every run and check of an example activates a disk: a push, not a patch
def _explore(contract: d.Contract, profile: str, block_size: int, seed: int) -> None:
    report = contract.explore(
        profile, modes=MODES, images_per_mode=IMAGES_PER_MODE, block_size=block_size, seed=seed
    )
    report.assert_ok()
    assert report.images_checked + report.images_reused >= (report.boundaries + 1) * len(MODES)


@st.composite
def mkdir_paths(draw: Any) -> list[str]:
    segment = st.sampled_from(["a", "b", "c"])
    paths = draw(st.lists(st.lists(segment, min_size=1, max_size=3), min_size=1, max_size=4))
    return list(dict.fromkeys("/".join(p) for p in paths))


@st.composite
def contracts(draw: Any) -> d.Contract:
    kind = draw(
        st.sampled_from(["atomic_write", "mkdir", "create", "unlink", "rename", "log", "session"]),
        label="primitive",
    )
    retry = draw(st.booleans(), label="retry after a failure")
    if kind == "atomic_write":
        return d.atomic_write_contract(
            draw(st.lists(sizes, min_size=1, max_size=4)), existing=draw(st.booleans()), retry=retry
        )
    if kind == "mkdir":
        return d.mkdir_contract(draw(mkdir_paths()), retry=retry)
    if kind == "create":
        return d.create_contract(draw(st.integers(1, 4)), retry=retry)
    if kind == "unlink":
        return d.unlink_contract(draw(st.integers(1, 4)), retry=retry)
    if kind == "rename":
        moves = draw(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=3))
        return d.rename_contract(moves)
    if kind == "log":
        entry_sizes = draw(st.lists(sizes, min_size=1, max_size=6))
        reopen = draw(st.sets(st.integers(1, len(entry_sizes))))
        return d.eventlog_contract(entry_sizes, sorted(reopen), retry=retry)
    return d.session_contract(draw(sizes), retry=retry)


# -- a fixed matrix: the representative shapes, exhaustively -------------------------

MATRIX = [
    d.atomic_write_contract([100, 1500, 4097], existing=True),
    d.atomic_write_contract([700, 0], existing=False),
    d.atomic_write_contract([100, 1500], retry=True),
    d.mkdir_contract(["a/b/c", "a/d", "e"]),
    d.mkdir_contract(["a/b/c", "a/d", "e"], retry=True),
    d.mkdir_contract(["a/a", "a/b"], retry=True),
    d.create_contract(3),
    d.create_contract(3, retry=True),
    d.unlink_contract(3),
    d.unlink_contract(3, retry=True),
    d.contents_contract(5000, 4097),
    d.contents_contract(1300, 700, retry=True),
    d.rename_contract(((False, False), (True, False), (True, True), (False, True))),
    d.eventlog_contract([40, 900, 30, 600, 4100], reopen_after=[1, 3]),
    d.eventlog_contract([10, 10, 10]),
    d.eventlog_contract(d.newline_alone_sizes(4), reopen_after=[2]),
    d.eventlog_contract([40, 900, 30, 600, 4100], reopen_after=[2], retry=True),
    d.pending_contract(4, 2),
    d.pending_contract(3, 4),
    d.session_contract(3000),
    d.session_contract(3000, retry=True),
]


@pytest.mark.parametrize("profile", ALL_PROFILES)
@pytest.mark.parametrize("contract", MATRIX, ids=[c.name for c in MATRIX])
def test_matrix(contract: d.Contract, profile: str) -> None:
    _explore(contract, profile, block_size=512, seed=0)


SHORT_WRITES = [
    d.with_short_writes(d.eventlog_contract([40, 900, 30, 2100], reopen_after=[2]), 1000),
    d.with_short_writes(d.atomic_write_contract([100, 1500], existing=True), 1000),
    d.with_short_writes(d.session_contract(3000), 1000),
]
"""Shapes whose writes the device takes in pieces (every write at most 1000 bytes): no
crash test wrote more than it was let, so a writer that ignored a short count (one
``os.write``, the rest dropped, the entry acknowledged torn) passed them all."""


@pytest.mark.parametrize("profile", ALL_PROFILES)
@pytest.mark.parametrize("contract", SHORT_WRITES, ids=[c.name for c in SHORT_WRITES])
def test_short_writes(contract: d.Contract, profile: str) -> None:
    _explore(contract, profile, block_size=512, seed=0)


@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_roll_after_repair(profile: str) -> None:
    """A log sealed right after an open cut its torn tail (a compaction after a recovery):
    the cut, never fsynced by an append, must not come back inside the sealed segment."""
    _explore(roll.roll_after_repair_contract(3), profile, block_size=512, seed=0)


@pytest.mark.parametrize("contract", MATRIX, ids=[c.name for c in MATRIX])
def test_matrix_fsync_failures(contract: d.Contract) -> None:
    for profile in ALL_PROFILES:
        markers = eio.marker_fsyncs(contract, profile)  # a termination's, once it is durable
        for nth in range(1, eio.count_fsyncs(contract, profile) + 1):
            for count, written in ((1, False), (2, True), (3, False)):
                outcome = eio.check_fsync_failure(
                    contract, profile, nth, count=count, written=written
                )
                assert outcome.raised is (nth not in markers), (
                    f"{profile}: EIO on fsync #{nth} was {'' if outcome.raised else 'not '}reported"
                )


# -- drawn shapes ------------------------------------------------------------------------


DRAWN_SHARDS = 2
"""Items each profile's drawn contracts run as, each with its share of the examples: on
posix the 50 of ``ci`` were one item of 2.1-2.6 CPU s, over 1/64 of that campaign."""


@pytest.mark.parametrize("shard", range(DRAWN_SHARDS))
@pytest.mark.parametrize("profile", ALL_PROFILES)
def test_drawn_contract(profile: str, shard: int) -> None:
    @settings(max_examples=examples_per_shard(DRAWN_SHARDS))
    @given(contract=contracts(), block_size=block_sizes, seed=st.integers(0, 2**16))
    def explore_drawn(contract: d.Contract, block_size: int, seed: int) -> None:
        _explore(contract, profile, block_size, seed)

    if settings().derandomize:  # else every item would draw the same examples
        key = f"{__name__}.test_drawn_contract[{profile}]#{shard}"
        explore_drawn = fixed_seed(zlib.crc32(key.encode()))(explore_drawn)
    explore_drawn()


@pytest.mark.parametrize("profile", ALL_PROFILES)
@given(contract=contracts(), data=st.data())
def test_drawn_fsync_failure(profile: str, contract: d.Contract, data: Any) -> None:
    fsyncs = eio.count_fsyncs(contract, profile)
    nth = data.draw(st.integers(1, fsyncs), label="failing fsync")
    count = data.draw(st.integers(1, 3), label="consecutive failures")
    written = data.draw(st.booleans(), label="written back anyway")
    outcome = eio.check_fsync_failure(contract, profile, nth, count=count, written=written)
    # a failed fsync of a terminated marker is not the termination's (its record is durable)
    reported = nth not in eio.marker_fsyncs(contract, profile)
    assert outcome.raised is reported, f"EIO on fsync #{nth} of {fsyncs}: raised {outcome.raised}"
