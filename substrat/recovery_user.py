"""The user's inbox at a start: its checkpoint's messages decoded when it is first read.

A start after a clean stop whose start summary vouches for the user's facts
(:mod:`substrat.summary_user`: the clean stop decoded them, and the user's log
is as it was then) takes the user's newest checkpoint as it would (it counts as
used, the checkpointer builds on it, the log's end is remembered) and defers its
facts: :meth:`DeferredUser.pending` decodes them when the user's inbox is first
asked for (:meth:`~substrat.agents.InboxRegistry.defer`: a read, an
acknowledgement, a message to the user). Nothing writes to the user's log before
that: every write to it is about a message of that inbox, and asks the inbox
first. A start whose plan rolls a message forward to the user decodes them at
once (:func:`for_plan`: the plan asks whether the user's log has it). The start
report lists the user's messages as redelivered from the entry's ids, in arrival
order among the other inboxes' (:func:`redelivered`), as a decoding start lists
them. Without such an entry the user's log is read at start, as always
(:func:`~substrat.recovery_logs.read_user`).

Should the facts not read after all when first asked for (the store's bytes
damaged after the clean stop without changing its fingerprint, or a summary
that vouched for facts it never decoded), the user's log is read as a start
without the checkpoint reads it, the checkpointer is told, and the daemon's log
says so (the other agents' checkpoints were trusted by then: a start that
decoded them would have read every log in full). The inbox comes out as a
decoding start builds it (``tests/integration/test_start_user_inbox.py``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from substrat import recovery_logs, summary_user
from substrat.agents import USER
from substrat.checkpoints import Checkpoint
from substrat.eventlog import Resume, any_suspect, is_suspect
from substrat.facts import AgentFacts
from substrat.recovery_logs import RootStores
from substrat.recovery_report import RecoveryReport
from substrat.rollforward import ARRIVAL
from substrat.start_summary import fingerprint

log = logging.getLogger("substrat.recovery")

Readopt = Callable[[str, Checkpoint, "Checkpoint | None"], None]
"""The checkpointer's :meth:`~substrat.checkpointer.Checkpointer.readopt`."""


@dataclass(eq=False)
class DeferredUser:
    """The user's facts, from ``checkpoint``, decoded when first asked for; ``stamps``
    and ``ids``: its pending messages' as the summary's entry holds them."""

    root: RootStores
    checkpoint: Checkpoint
    report: RecoveryReport
    stamps: list[str]
    ids: list[str]
    readopt: Readopt | None = None
    """Set once the checkpointer adopted ``checkpoint``, to take it back if it fails."""

    def facts(self) -> AgentFacts:
        """The user's facts, as the start would have read them."""
        try:
            facts = self.checkpoint.load_facts()
        except ValueError as exc:
            return self._read_again(str(exc))
        facts.last_complete = None  # as recovery_logs._for_start has it
        return facts

    def pending(self) -> list[dict[str, Any]]:
        """The user's pending messages (valid envelopes), in arrival order."""
        pending = self.facts().pending()
        pending.sort(key=ARRIVAL)
        return pending

    def delivered(self, ids: list[str]) -> None:
        """The deferred messages are in the inbox now: the report listed them at start."""
        if ids != self.ids:  # only if the facts did not read after all: see the docstring
            log.warning(
                "the user's inbox holds %d messages, not the %d the start reported",
                len(ids),
                len(self.ids),
            )

    def _read_again(self, why: str) -> AgentFacts:
        root, report = self.root, self.report
        report.checkpoints_used -= 1
        if root.used.get(USER) is self.checkpoint:
            del root.used[USER]
        read = recovery_logs.read_user(root, report)
        if self.readopt is not None:
            self.readopt(USER, self.checkpoint, root.used.get(USER))
        log.warning(
            "the user's checkpoint did not read when the inbox was first asked for (%s), "
            "though the start summary vouched for it: the user's log was read without it",
            why,
        )
        return read


def read_user(root: RootStores, report: RecoveryReport) -> AgentFacts | DeferredUser:
    """The user's facts (:func:`~substrat.recovery_logs.read_user`), or their decoding
    deferred when the start summary vouches for them (see the module docstring)."""
    summary = root.summary
    if summary is not None and summary.user is not None:
        deferred = _vouched(root, summary.user, report)
        if deferred is not None:
            return deferred
        report.summary_passed_over.append(USER)
    return recovery_logs.read_user(root, report)


def _vouched(root: RootStores, user: Any, report: RecoveryReport) -> DeferredUser | None:
    """The deferred user if its log is as the summary's entry says (one ``stat``, as an
    agent's entry is checked: see ``Summary.log_holds``); None otherwise."""
    held = summary_user.parts(user)
    checkpoint = root.checkpoints.newest(USER)
    if held is None or checkpoint is None or checkpoint.at.file_first != 1:
        return None
    log_fingerprint, stamps, ids = held
    path = root.logs.path_text(USER)
    root.logs.close(USER)
    try:
        st = os.stat(path)
    except OSError:
        return None
    at = checkpoint.at
    if (
        fingerprint(st) != log_fingerprint
        or st.st_size != at.offset + at.length
        or (any_suspect() and is_suspect(path))
    ):
        return None
    report.checkpoints_used += 1
    root.used[USER] = checkpoint
    # its pending file is not looked at, as an agent's the summary gave (Resume.summarized)
    root.logs.remember(USER, Resume(st.st_size, at.seq, True))
    return DeferredUser(root, checkpoint, report, stamps, ids)


def for_plan(
    user: AgentFacts | DeferredUser, facts: dict[str, AgentFacts]
) -> tuple[AgentFacts, DeferredUser | None]:
    """The user's facts for the roll-forward plan, and what stays deferred: nothing if a
    committed turn in ``facts`` sent the user a message (the plan asks whether the
    user's log has it)."""
    if not isinstance(user, DeferredUser):
        return user, None
    for f in facts.values():
        for effects in f.committed:
            if any(_to_user(data) for data in effects.get("messages", ())):
                return user.facts(), None
    return AgentFacts(USER), user


def redelivered(deferred: DeferredUser, others: list[dict[str, Any]]) -> list[str]:
    """The report's redelivered ids: the user's deferred messages among ``others`` (the
    plan's pending messages delivered at start, in arrival order)."""
    keys = [(data["timestamp"], data["message_id"]) for data in others]
    return summary_user.merged(deferred.stamps, deferred.ids, keys)


def _to_user(data: object) -> bool:
    return isinstance(data, dict) and data.get("recipient") == USER
