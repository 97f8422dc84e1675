"""The running orchestrator after an I/O error: what it must show when it goes on.

docs/orchestrator.md ("I/O errors"): an operation reported as failed never
comes back, not in the running daemon and not after any crash. So after an
operation answered ``DurabilityError`` (or a turn reported failed), the running
orchestrator's memory must equal the acknowledged state without it:

* the failed operation is not visible as done (no root or child it would have
  made, no turn in a conversation, no message it sent, no message it consumed or
  acknowledged gone from an inbox, no agent it terminated gone);
* nothing acknowledged before it has disappeared (agents, conversations, every
  inbox, the user's included), though the disk holds all of it: a process that
  hides what it still owes the user has lost it for every reader until a restart.

An operation whose EIO never reached its answer (``done``) is acknowledged as
usual and held to the same comparison with the model that includes it. An
*undecided* one (``OutcomeUnknownError``) is not checked here: it may be done or
not, and its effects may be applied in part until a restart settles it (the
documented answer), so the machine crashes and recovers right after it, and
recovery's check allows either outcome.

The machine calls :func:`check_after_eio` right after such an operation, then
goes on running steps on the same orchestrator and crashes later as usual, when
the model holds the failed operation as failed: if it comes back after that
crash, :func:`oracle.checks.check_recovery` reports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oracle.checks import diff, expected, observe
from oracle.errors import OracleViolation

if TYPE_CHECKING:
    from oracle.harness import CrashHarness

OUTCOMES_GOING_ON = ("done", "failed")
"""The outcomes of :meth:`CrashHarness.run_failing_fsyncs` after which the steps may go
on on the running orchestrator (an ``undecided`` one needs a restart to settle it)."""


def check_after_eio(harness: CrashHarness, outcome: str) -> None:
    """The running state after an operation an I/O error hit equals the model.

    ``outcome`` is what :meth:`CrashHarness.run_failing_fsyncs` returned, ``done`` or
    ``failed`` (see the module docstring for why not ``undecided``). Raises an
    :class:`OracleViolation` naming, in the model's terms, what the failed
    operation shows as done and what acknowledged before it went missing.
    """
    assert outcome in OUTCOMES_GOING_ON, outcome
    model = harness.model
    with harness.fs:
        got = observe(harness.orch, memos=harness.memos, fs=harness.fs)
    names = {a.agent_id: a.name for a in model.state.agents.values()}
    problems = diff(expected(model.state), got, names)
    if not problems:
        return
    # diff's words: "lost ..." is acknowledged state the process no longer shows,
    # "unexpected ..." state no acknowledgement made (the failed operation's, shown
    # as done); a changed agent or conversation may be either.
    shown = [p for p in problems if "unexpected" in p]
    lost = [p for p in problems if "lost" in p and p not in shown]
    other = [p for p in problems if p not in shown and p not in lost]
    last = model.trace[-1].describe() if model.trace else "no operation"
    parts = [f"after an I/O error the running orchestrator differs from the model (last: {last})"]
    if shown:
        parts.append("shown as done though never acknowledged (the failed operation?):")
        parts.extend(f"  {p}" for p in shown)
    if lost:
        parts.append("acknowledged before it, gone from the running state:")
        parts.extend(f"  {p}" for p in lost)
    parts.extend(f"  {p}" for p in other)
    raise OracleViolation("\n  ".join(parts), trace=model.trace_lines())
