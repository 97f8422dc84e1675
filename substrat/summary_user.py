"""The start summary's user entry: a clean stop vouches that the user's facts read.

The user's log holds every message an agent sent the user and the user has not
acknowledged: thousands at a root with many agents (10,000 agents that each
reported once: 9,900 unread, a 2.5 MB checkpoint line in the store). A start
that decodes them before it serves pays 4-5 us per agent for it
(docs/benchmarks.md, the sixteenth and seventeenth passes), though nothing at a
start needs them unless a committed turn rolls a message forward to the user;
only a read of the user's inbox does. :mod:`substrat.recovery_user` defers them
to that read.

Deferring is safe only if the start knows, before it trusts the other agents'
checkpoints, that the user's facts read: a start that finds a checkpoint whose
facts do not read sets every checkpoint aside (``recovery._checkpoints_in_doubt``),
and found later there is no going back. So the clean stop that writes the summary
decodes the user's newest checkpoint once, as a start would
(:meth:`~substrat.checkpoints.Checkpoint.load_facts`: JSON, every pending message
an envelope this version delivers), and only if it reads writes the user's entry
(:func:`entry`): ``[log fingerprint, timestamps, message ids]`` of the pending
messages in arrival order, which the start report lists as redelivered (see
:func:`substrat.recovery_user.redelivered`). The summary's checksum, its format
(3) and the store's fingerprint say the line it vouched for is the one in the
store; the user log's fingerprint says the log ends where that checkpoint does.
Anything the entry cannot vouch for (no entry: a format 2 summary, facts that did
not read, too many messages; a log not as the entry says) is decoded at start as
without a summary.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

from substrat.checkpoints import Checkpoint
from substrat.rollforward import ARRIVAL

MAX_MESSAGES = 50_000
"""A user's inbox with more unread messages is decoded at start: their ids in the summary
(about 60 bytes each) would crowd its one read (``start_summary.SUMMARY_READ_BYTES``)."""

_STR = {str}


def entry(checkpoint: Checkpoint, log_fingerprint: list[int]) -> list[Any] | None:
    """The user's entry for a log that ends where ``checkpoint`` does (its
    ``log_fingerprint``), if its facts read as a start reads them; None otherwise."""
    try:
        facts = checkpoint.load_facts()
    except ValueError:
        return None  # a start decodes it, and sets the store aside if it must
    pending = facts.pending()
    if len(pending) > MAX_MESSAGES:
        return None
    pending.sort(key=ARRIVAL)
    return [
        log_fingerprint,
        [data["timestamp"] for data in pending],
        [data["message_id"] for data in pending],
    ]


def parts(user: Any) -> tuple[list[int], list[str], list[str]] | None:
    """The entry's log fingerprint, timestamps and message ids, if it is one :func:`entry`
    writes (the file is checksummed: this is about a format's shape, not damage)."""
    if type(user) is not list or len(user) != 3:
        return None
    fingerprint, stamps, ids = user
    if type(fingerprint) is not list or type(stamps) is not list or type(ids) is not list:
        return None
    if len(stamps) != len(ids):
        return None
    if ids and not set(map(type, ids)) | set(map(type, stamps)) <= _STR:
        return None
    return fingerprint, stamps, ids


def merged(stamps: list[str], ids: list[str], others: list[tuple[str, str]]) -> list[str]:
    """The ids of the user's messages (``stamps``, ``ids``: in arrival order) among
    ``others`` ((timestamp, id) of the other inboxes' messages), in arrival order, as a
    start that decodes the user's lists them all."""
    if not others:
        return list(ids)
    keys = [*zip(stamps, ids, repeat(0)), *((stamp, mid, 1) for stamp, mid in others)]
    keys.sort()
    return [mid for _, mid, _ in keys]
