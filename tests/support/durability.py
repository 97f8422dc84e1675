"""The crash contracts of substrat's durable primitives, as faultfs workloads and checks.

Each :class:`Contract` is a small deterministic program that uses one primitive
(``atomic_write``, ``durable_mkdir``, ``durable_create``, ``durable_unlink``,
``durable_contents``, ``durable_rename``, ``EventLog``, ``SessionStore``) and acknowledges each call
that returned with ``fs.ack(i)``; its check runs on a crash image and raises
when the image breaks what the primitive promises. The checks depend only on
the image's files and ``img.acked``, as ``faultfs.explore`` deduplication needs.

Used by tests/unit/test_persistence_crash.py (small cases) and
tests/stress/test_persistence_fuzz.py (every profile, every mode, drawn sizes).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from faultfs import MODES, ExploreReport, FaultFS, explore
from substrat import persistence
from substrat.errors import DurabilityError, LogClosedError, OutcomeUnknownError
from substrat.eventlog import PENDING_NAME, EventLog, encode_entry, read_log
from substrat.session import Session, SessionState, SessionStore

ROOT = "/substrat-durability"
SESSION_ID = "5e55" * 8
FIXED_TS = "2026-01-01T00:00:00.000000+00:00"
T = TypeVar("T")
LOG_EVENT = "message.enqueued"
PROBE_EVENT = "message.delivered"
FAILURE_SEEN = "DurabilityError raised"
"""Acknowledged (as a marker) by a retrying workload when a call failed and it retried."""


def fixed_clock() -> str:
    return FIXED_TS


def pattern(tag: int, size: int) -> bytes:
    """``size`` bytes that differ from every other tag's bytes in every block."""
    unit = f"<{tag:03d}>".encode()
    return (unit * (size // len(unit) + 1))[:size]


@dataclass(frozen=True)
class Contract:
    """One primitive's promise: a workload that acknowledges, and a check of an image."""

    name: str
    workload: Callable[[FaultFS], None]
    check: Callable[[FaultFS], None]
    setup: Callable[[FaultFS], None] | None = None

    def explore(
        self,
        profile: str,
        *,
        modes: Sequence[str] = MODES,
        images_per_mode: int = 8,
        block_size: int = 512,
        seed: int = 0,
    ) -> ExploreReport:
        return explore(
            self.workload,
            self.check,
            modes=modes,
            profile=profile,
            root=ROOT,
            setup=self.setup,
            images_per_mode=images_per_mode,
            block_size=block_size,
            seed=seed,
        )


def with_short_writes(contract: Contract, max_bytes: int) -> Contract:
    """``contract`` on a device whose every write takes at most ``max_bytes`` (a signal, a
    pipe, a network file system): ``os.write`` returns a count, and a primitive that does
    not loop over it loses the rest of an acknowledged write. Every promise must hold."""

    def workload(fs: FaultFS) -> None:
        fs.short_writes(max_bytes)
        try:
            contract.workload(fs)
        finally:
            fs.short_writes(None)

    return Contract(
        f"{contract.name} writes of {max_bytes}", workload, contract.check, contract.setup
    )


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _newest_acked(img: FaultFS) -> int:
    return max((a for a in img.acked if isinstance(a, int)), default=0)


def _one_of(found: bytes | None, allowed: dict[str, bytes | None], what: str) -> None:
    if found not in allowed.values():
        shown = found if found is None else found[:48]
        raise AssertionError(
            f"{what}: found {shown!r} ({'absent' if found is None else len(found)} bytes), "
            f"but only {sorted(allowed)} are allowed here"
        )


class _Retry:
    """Runs a workload's calls; when enabled, a call that raises DurabilityError (an
    injected EIO) is retried once, as a caller heeding "not acknowledged" would."""

    def __init__(self, fs: FaultFS, enabled: bool) -> None:
        self.fs, self.enabled, self.used = fs, enabled, False

    def __call__(self, call: Callable[..., T], *args: Any) -> T:
        try:
            return call(*args)
        except DurabilityError:
            if not self.enabled or self.used:
                raise
            self.used = True
            self.fs.ack(FAILURE_SEEN)
            return call(*args)


def _acked_ints(img: FaultFS) -> list[int]:
    return [a for a in img.acked if isinstance(a, int)]


# ------------------------------------------------------------------ atomic_write


def atomic_write_contract(
    sizes: Sequence[int], *, existing: bool = True, retry: bool = False
) -> Contract:
    """Versions 1..n written over ``target``; version 0 is the old file (or none)."""
    versions: list[bytes | None] = [pattern(0, 300) if existing else None]
    versions += [pattern(i, size) for i, size in enumerate(sizes, start=1)]

    def setup(fs: FaultFS) -> None:
        os.makedirs(fs.path("d"))
        if existing:
            with open(fs.path("d", "target"), "wb") as handle:
                handle.write(versions[0] or b"")

    def workload(fs: FaultFS) -> None:
        attempt = _Retry(fs, retry)
        for i in range(1, len(versions)):
            data = versions[i]
            assert data is not None
            attempt(persistence.atomic_write, fs.path("d", "target"), data)
            fs.ack(i)

    def check(img: FaultFS) -> None:
        last = _newest_acked(img)
        allowed = {f"version {last} (acknowledged)": versions[last]}
        if last + 1 < len(versions):
            allowed[f"version {last + 1} (in flight)"] = versions[last + 1]
        _one_of(_read(img.path("d", "target")), allowed, "atomic_write target")
        stray = set(os.listdir(img.path("d"))) - {"target", "target" + persistence.TMP_SUFFIX}
        assert not stray, f"atomic_write left unexpected files {sorted(stray)}"
        # The next write replaces any stale temp file and leaves none behind.
        persistence.atomic_write(img.path("d", "target"), b"after recovery")
        assert _read(img.path("d", "target")) == b"after recovery"
        assert os.listdir(img.path("d")) == ["target"], os.listdir(img.path("d"))

    name = f"atomic_write{list(sizes)}{' retry' if retry else ''}"
    return Contract(name, workload, check, setup)


# ------------------------------------------------------------------ namespace


def mkdir_contract(paths: Sequence[str], *, retry: bool = False) -> Contract:
    """durable_mkdir of each relative path (parents included); acked ones must exist."""

    def workload(fs: FaultFS) -> None:
        attempt = _Retry(fs, retry)
        for i, rel in enumerate(paths, start=1):
            attempt(persistence.durable_mkdir, fs.path(rel))
            fs.ack(i)

    def check(img: FaultFS) -> None:
        for i in _acked_ints(img):
            rel = paths[i - 1]
            assert os.path.isdir(img.path(rel)), f"acknowledged durable_mkdir({rel!r}) is lost"
        for rel in paths:  # idempotent on whatever survived
            persistence.durable_mkdir(img.path(rel))
            assert os.path.isdir(img.path(rel))

    return Contract(f"durable_mkdir{list(paths)}{' retry' if retry else ''}", workload, check)


def create_contract(count: int, *, retry: bool = False) -> Contract:
    """durable_create of new files, then of an existing file (which keeps its bytes)."""
    kept = pattern(7, 700)

    def setup(fs: FaultFS) -> None:
        os.makedirs(fs.path("d"))
        with open(fs.path("d", "keep"), "wb") as handle:
            handle.write(kept)

    def workload(fs: FaultFS) -> None:
        attempt = _Retry(fs, retry)
        for i in range(1, count + 1):
            attempt(persistence.durable_create, fs.path("d", f"f{i}"))
            fs.ack(i)
        attempt(persistence.durable_create, fs.path("d", "keep"))
        fs.ack(count + 1)

    def check(img: FaultFS) -> None:
        for i in _acked_ints(img):
            if i <= count:
                found = _read(img.path("d", f"f{i}"))
                assert found == b"", f"acknowledged durable_create(f{i}) left {found!r}"
        assert _read(img.path("d", "keep")) == kept, "durable_create changed an existing file"

    return Contract(f"durable_create x{count}{' retry' if retry else ''}", workload, check, setup)


def unlink_contract(count: int, *, retry: bool = False) -> Contract:
    """durable_unlink of existing files; an acknowledged removal stays removed.

    A retried call finds the file already gone (its first attempt removed it
    before the fsync failed) and must still make the removal durable.
    """
    contents = {i: pattern(i, 100 * i) for i in range(1, count + 1)}

    def setup(fs: FaultFS) -> None:
        os.makedirs(fs.path("d"))
        for i, data in contents.items():
            with open(fs.path("d", f"f{i}"), "wb") as handle:
                handle.write(data)

    def workload(fs: FaultFS) -> None:
        attempt = _Retry(fs, retry)
        for i in contents:
            used = attempt.used
            existed = attempt(persistence.durable_unlink, fs.path("d", f"f{i}"))
            assert existed is (attempt.used == used), "durable_unlink misreported the file"
            fs.ack(i)
        assert persistence.durable_unlink(fs.path("d", "never-was")) is False

    def check(img: FaultFS) -> None:
        for i, data in contents.items():
            found = _read(img.path("d", f"f{i}"))
            if i in img.acked:
                assert found is None, f"acknowledged durable_unlink(f{i}) came back"
            else:
                assert found in (None, data), f"f{i} was damaged: {found!r}"

    return Contract(f"durable_unlink x{count}{' retry' if retry else ''}", workload, check, setup)


def contents_contract(size: int, cut: int, *, retry: bool = False) -> Contract:
    """durable_contents of a file whose cut (as an open's repair makes one) was never
    fsynced: once acknowledged, the disk holds exactly what the file showed."""
    data = pattern(1, size)

    def setup(fs: FaultFS) -> None:
        os.makedirs(fs.path("d"))
        with open(fs.path("d", "f"), "wb") as handle:
            handle.write(data)

    def workload(fs: FaultFS) -> None:
        os.truncate(fs.path("d", "f"), cut)  # not fsynced, as a repair at open
        _Retry(fs, retry)(persistence.durable_contents, fs.path("d", "f"))
        fs.ack(1)

    def check(img: FaultFS) -> None:
        found = _read(img.path("d", "f"))
        if 1 in img.acked:
            assert found == data[:cut], (
                f"acknowledged durable_contents left {len(found or b'')} bytes"
            )
        else:
            _one_of(found, {"before": data, "cut": data[:cut]}, "durable_contents in flight")

    return Contract(
        f"durable_contents {size}->{cut}{' retry' if retry else ''}", workload, check, setup
    )


def rename_contract(
    moves: Sequence[tuple[bool, bool]] = ((False, False), (True, True)),
) -> Contract:
    """One durable_rename per ``(cross_dir, replace)``: from ``a/`` to ``a/`` or ``b/``,
    onto a new name or over an existing file."""
    # (source, destination, data, what the destination held before)
    plan: list[tuple[str, str, bytes, bytes | None]] = []
    for i, (cross, replace) in enumerate(moves, start=1):
        dst = f"{'b' if cross else 'a'}/t{i}"
        plan.append(
            (f"a/s{i}", dst, pattern(i, 300 * i), pattern(50 + i, 200) if replace else None)
        )

    def setup(fs: FaultFS) -> None:
        os.makedirs(fs.path("a"))
        os.makedirs(fs.path("b"))
        for src, dst, data, before in plan:
            for rel, content in ((src, data), (dst, before)):
                if content is not None:
                    with open(fs.path(rel), "wb") as handle:
                        handle.write(content)

    def workload(fs: FaultFS) -> None:
        for i, (src, dst, _, _) in enumerate(plan, start=1):
            persistence.durable_rename(fs.path(src), fs.path(dst))
            fs.ack(i)

    def check(img: FaultFS) -> None:
        for i, (src, dst, data, before) in enumerate(plan, start=1):
            at_src, at_dst = _read(img.path(src)), _read(img.path(dst))
            if i in img.acked:
                assert at_dst == data, f"acknowledged rename {src} -> {dst}: {dst} lost the data"
                assert at_src is None, f"acknowledged rename {src} -> {dst}: {src} came back"
                continue
            # In flight: both names may exist for a moment, but the data is never lost.
            assert data in (at_src, at_dst), f"rename {src} -> {dst} lost the file"
            assert at_src in (None, data), f"{src} damaged"
            assert at_dst in (before, data), f"{dst} holds neither the old nor the new file"

    return Contract(f"durable_rename{list(moves)}", workload, check, setup)


# ------------------------------------------------------------------ event log


def _entry_data(seq: int, size: int, attempt: int = 1) -> dict[str, Any]:
    data: dict[str, Any] = {"n": seq, "pad": pattern(seq, size).decode()}
    if attempt > 1:
        data["attempt"] = attempt  # a retried entry differs from the one that failed
    return data


def open_log(fs: FaultFS) -> EventLog:
    return EventLog(fs.path("s", "events.jsonl"), {"session_id": SESSION_ID}, clock=fixed_clock)


def newline_alone_sizes(count: int, block_size: int = 512) -> list[int]:
    """Payload sizes for entries 1..``count`` whose every line ends with its newline
    alone at the start of a block: a write torn at that block boundary leaves the whole
    entry but its newline (a line that decodes, unterminated), which random sizes cut
    about once in a block's length. A reader that takes it as whole has the next
    append glued onto it."""
    sizes, offset = [], 0
    for seq in range(1, count + 1):
        body = {"seq": seq, "session_id": SESSION_ID, "ts": FIXED_TS, "event": LOG_EVENT}
        base = len(encode_entry({**body, "data": _entry_data(seq, 0)}))
        size = -(offset + base - 1) % block_size  # pattern bytes encode one to one
        sizes.append(size)
        offset += base + size
    return sizes


FAILED, UNKNOWN = "failed", "unknown"
"""Markers acknowledged with (marker, seq, attempt) when an append raised: FAILED for a
DurabilityError (the entry must never appear), UNKNOWN for an OutcomeUnknownError."""


def eventlog_contract(
    sizes: Sequence[int], reopen_after: Sequence[int] = (), *, retry: bool = False
) -> Contract:
    """Entries 1..n logged (payload sizes ``sizes``); the log is reopened after each
    seq in ``reopen_after``.

    An append that raises is recorded: DurabilityError means it was taken back and
    must never appear in any image; OutcomeUnknownError means it may. With ``retry``,
    a failed append is retried once on a reopened log in the same process, as a
    caller following DurabilityError's advice would; the retry (different data)
    must get the same seq and, once acknowledged, be as durable as any other.
    """

    def setup(fs: FaultFS) -> None:
        os.makedirs(fs.path("s"))

    def workload(fs: FaultFS) -> None:
        log = open_log(fs)
        attempt, retried = 1, False
        seq = 1
        while seq <= len(sizes):
            try:
                got = log.log(LOG_EVENT, _entry_data(seq, sizes[seq - 1], attempt))
            except DurabilityError as exc:
                _assert_poisoned(log)
                outcome = UNKNOWN if isinstance(exc, OutcomeUnknownError) else FAILED
                fs.ack((outcome, seq, attempt))
                if not retry or retried:
                    raise
                attempt, retried = 2, True
                fs.ack(FAILURE_SEEN)
                log = open_log(fs)  # "reopen the log before writing again"
                continue
            assert got == seq, f"log() returned seq {got}, expected {seq}"
            fs.ack(seq)
            attempt = 1
            if seq in reopen_after:
                log.close()
                log = open_log(fs)
            seq += 1
        log.close()

    def check(img: FaultFS) -> None:
        last = _newest_acked(img)
        failed = {(a[1], a[2]) for a in img.acked if isinstance(a, tuple) and a[0] == FAILED}
        tried = {(a[1], a[2]) for a in img.acked if isinstance(a, tuple)}
        log = open_log(img)
        try:
            read = read_log(log.path, known_events=None)
            assert read.damage.clean, f"log damaged after reopening: {read.damage.counts()}"
            seqs = [e["seq"] for e in read.entries]
            assert seqs == list(range(1, len(seqs) + 1)), f"seqs not 1..n once each: {seqs}"
            assert len(seqs) >= last, (
                f"acknowledged entries lost: log ends at {len(seqs)}, acked {last}"
            )
            assert len(seqs) <= min(last + 1, len(sizes)), f"log holds unwritten entries: {seqs}"
            for entry in read.entries:
                seq = entry["seq"]
                if seq <= last:  # acknowledged: the attempt that returned
                    allowed = [2 if (seq, 1) in tried else 1]
                else:  # in flight, or undecided: any attempt not reported as failed
                    allowed = [a for a in (1, 2) if (seq, a) not in failed]
                wanted = [_entry_data(seq, sizes[seq - 1], a) for a in allowed]
                assert entry["data"] in wanted, (
                    f"entry {seq} holds {entry['data']!r}; allowed attempts {allowed} "
                    f"(reported failed: {sorted(a for s, a in failed if s == seq)})"
                )
                assert entry["event"] == LOG_EVENT and entry["session_id"] == SESSION_ID
            probe = log.log(PROBE_EVENT, {"probe": True})
            assert probe == len(seqs) + 1, f"append after reopen got seq {probe}"
        finally:
            log.close()
        again = open_log(img)
        again.close()
        after = read_log(again.path, known_events=None)
        assert after.damage.clean, f"append after repair glued onto damage: {after.damage.counts()}"
        assert [e["seq"] for e in after.entries] == list(range(1, len(seqs) + 2))
        assert after.entries[-1]["event"] == PROBE_EVENT

    shown = f"{list(sizes)} reopen after {list(reopen_after)}" if reopen_after else list(sizes)
    return Contract(f"EventLog{shown}{' retry' if retry else ''}", workload, check, setup)


def pending_contract(logged: int, pending_seq: int) -> Contract:
    """A log of ``logged`` entries with an ``events.pending`` a killed process left,
    holding entry ``pending_seq`` (durable): at or before the tail (already logged,
    so never appended again) or the next one (its append was cut, so it is replayed).
    The workload opens the log and appends one entry."""
    assert 1 <= pending_seq <= logged + 1

    def line(seq: int) -> bytes:
        body = {"seq": seq, "session_id": SESSION_ID, "ts": FIXED_TS, "event": LOG_EVENT}
        body["data"] = _entry_data(seq, 40 * seq)
        return encode_entry(body)

    def setup(fs: FaultFS) -> None:
        os.makedirs(fs.path("s"))
        with open(fs.path("s", "events.jsonl"), "wb") as handle:
            handle.write(b"".join(line(seq) for seq in range(1, logged + 1)))
        with open(fs.path("s", PENDING_NAME), "wb") as handle:
            handle.write(line(pending_seq))

    def workload(fs: FaultFS) -> None:
        log = open_log(fs)
        fs.ack("opened")
        assert log.log(PROBE_EVENT, {"probe": True}) == max(logged, pending_seq) + 1
        fs.ack(1)
        log.close()

    def check(img: FaultFS) -> None:
        open_log(img).close()
        read = read_log(img.path("s", "events.jsonl"), known_events=None)
        assert read.damage.clean, f"log damaged after reopening: {read.damage.counts()}"
        seqs = [e["seq"] for e in read.entries]
        assert seqs[: max(logged, pending_seq)] == list(range(1, max(logged, pending_seq) + 1)), (
            f"the pending entry {pending_seq} was lost or appended twice: seqs {seqs}"
        )
        assert len(seqs) == len(set(seqs)), f"an entry appears twice: {seqs}"
        if 1 in img.acked:
            assert read.entries[-1]["event"] == PROBE_EVENT, "the acknowledged append is lost"

    return Contract(f"EventLog pending {pending_seq} of {logged}", workload, check, setup)


def _assert_poisoned(log: EventLog) -> None:
    """After a failed append nothing more is accepted until the log is reopened."""
    assert log.closed, "a log whose append failed must refuse further appends"
    try:
        log.log(LOG_EVENT, {"after": "failure"})
    except LogClosedError:
        return
    raise AssertionError("a poisoned log accepted an append")


# ------------------------------------------------------------------ session store


def session_versions(blob_size: int) -> list[tuple[str, bytes]]:
    """The steps of the session workload and the record each one leaves."""
    session = Session(SESSION_ID, "scripted", "model-x", agent_id="a" * 32)
    out = [("save", session.to_record())]
    session.transition(SessionState.ACTIVE)
    out.append(("transition active", session.to_record()))
    session.provider_state, session.state_seq = pattern(5, blob_size), 7
    out.append(("save blob", session.to_record()))
    session.transition(SessionState.SUSPENDED)
    out.append(("transition suspended", session.to_record()))
    session.transition(SessionState.TERMINATED)
    out.append(("transition terminated", session.to_record()))
    return out


def session_contract(blob_size: int, *, retry: bool = False) -> Contract:
    """save, transitions and a blob update: the record is always one whole version.

    With ``retry``, a step that fails (an injected EIO) is retried once: the failed
    step left the session unchanged in memory, so the same call is valid again,
    and a retried first save must make the directory the failed one left durable.
    """
    versions = session_versions(blob_size)

    def workload(fs: FaultFS) -> None:
        store = SessionStore(fs.root)
        session = Session(SESSION_ID, "scripted", "model-x", agent_id="a" * 32)
        steps: list[Callable[[], None]] = [
            lambda: store.save(session),
            lambda: store.transition(session, SessionState.ACTIVE),
            lambda: _save_blob(store, session, pattern(5, blob_size)),
            lambda: store.transition(session, SessionState.SUSPENDED),
            lambda: store.transition(session, SessionState.TERMINATED),
        ]
        retried = False
        for i, step in enumerate(steps, start=1):
            before = session.state
            try:
                step()
            except DurabilityError:
                assert session.state is before, "a failed transition changed the state in memory"
                if not retry or retried:
                    raise
                retried = True
                fs.ack(FAILURE_SEEN)
                step()
            fs.ack(i)

    def check(img: FaultFS) -> None:
        last = _newest_acked(img)
        store = SessionStore(img.root)
        scan = store.scan(quarantine=False)
        assert not scan.quarantined, f"corrupt session record: {scan.quarantined}"
        found = _read(store.record_path(SESSION_ID))
        allowed: dict[str, bytes | None] = {}
        if last == 0:
            allowed["nothing yet"] = None
        else:
            allowed[f"{versions[last - 1][0]} (acknowledged)"] = versions[last - 1][1]
        if last < len(versions):
            allowed[f"{versions[last][0]} (in flight)"] = versions[last][1]
        _one_of(found, allowed, "session.json")
        if SESSION_ID in store.marked_terminated():  # a restart would not read the record
            assert found is not None, "a terminated marker and no record"
            state = Session.from_record(found).state
            assert state is SessionState.TERMINATED, f"a terminated marker on a {state} record"
        recovered = store.recover()
        assert not recovered.quarantined
        if found is not None:
            assert store.load(SESSION_ID).state is not SessionState.ACTIVE

    name = f"SessionStore blob={blob_size}{' retry' if retry else ''}"
    return Contract(name, workload, check)


def _save_blob(store: SessionStore, session: Session, blob: bytes) -> None:
    session.provider_state, session.state_seq = blob, 7
    store.save(session)


# ------------------------------------------------------------------ fsync failures
