"""Fsync failures (EIO) against the crash contracts of tests/support/durability.py.

:func:`check_fsync_failure` fails chosen fsyncs of a contract's workload and checks
that the call raised and that every crash image taken afterwards still keeps the
contract. Used by tests/unit/test_persistence_crash.py and
tests/stress/test_persistence_fuzz.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from faultfs import MODES, FaultFS
from oracle.faults import failing_fsync
from oracle.sweep import quiet_runtime
from substrat.errors import DurabilityError
from substrat.session import SessionStore
from tests.support.durability import FAILURE_SEEN, ROOT, Contract


@quiet_runtime()
def count_fsyncs(contract: Contract, profile: str = "posix") -> int:
    fs = _prepared(contract, profile)
    with fs, failing_fsync(fs, 0) as calls:
        contract.workload(fs)
    return calls[0]


def marker_fsyncs(contract: Contract, profile: str = "posix") -> set[int]:
    """The fsyncs (numbered as :func:`count_fsyncs` counts them) that only make a session's
    terminated marker durable: the last a termination does. Their failure is not the
    termination's, whose record is durable by then (``SessionStore._mark_terminated``)."""
    original = SessionStore._mark_terminated
    SessionStore._mark_terminated = lambda self, session_id: None  # type: ignore[method-assign]
    try:
        without = count_fsyncs(contract, profile)
    finally:
        SessionStore._mark_terminated = original  # type: ignore[method-assign]
    return set(range(without + 1, count_fsyncs(contract, profile) + 1))


def _prepared(contract: Contract, profile: str) -> FaultFS:
    fs = FaultFS(ROOT, profile)
    if contract.setup is not None:
        with fs:
            contract.setup(fs)
        fs.sync_all()
    return fs


@dataclass
class EioOutcome:
    raised: bool
    images_checked: int


@quiet_runtime()  # its run and each image's check activate a disk: a push, not a patch
def check_fsync_failure(
    contract: Contract,
    profile: str,
    nth: int,
    *,
    count: int = 1,
    written: bool = False,
    images_per_mode: int = 8,
) -> EioOutcome:
    """Fail fsyncs ``nth`` .. ``nth + count - 1`` of the workload (see :func:`failing_fsync`);
    the call must raise DurabilityError (the workload stops, or retries if its contract
    says so), and every crash image taken afterwards must still satisfy the contract:
    what was acknowledged is durable, the failed call is not acknowledged."""
    fs = _prepared(contract, profile)
    raised = False
    with fs:
        try:
            with failing_fsync(fs, nth, count, written=written):
                contract.workload(fs)
        except DurabilityError:
            raised = True
    raised = raised or FAILURE_SEEN in fs.acked
    checked = 0
    for mode in MODES:
        for img in fs.crash_images(mode, limit=images_per_mode):
            with img:
                try:
                    contract.check(img)
                except Exception as exc:
                    origin = img.origin
                    where = origin.detail if origin is not None else "?"
                    raise AssertionError(
                        f"{contract.name}: after EIO on fsyncs #{nth}..#{nth + count - 1}"
                        f"{' (written back)' if written else ''}, {mode} image ({where}) "
                        f"breaks the contract: {exc}"
                    ) from exc
            checked += 1
    return EioOutcome(raised, checked)
