"""How the daemon words a recovery report: one line for daemon.log and the CLI, why a
start did not use the start summary, and which logs came back shorter than their
checkpoints. Values in, words out: nothing here reads the root."""

from __future__ import annotations

from typing import Any

from substrat import start_summary
from substrat.checkpoints import LOG_SHORTER
from substrat.words import plural


def summary_unused(data: dict[str, Any]) -> dict[str, Any] | None:
    """Why the start did not use the start summary, in a recovery report's ``data``:
    ``{"message", "damaged"}``, or None when it used it (or there was none)."""
    reason = data.get("start_summary")
    if not reason:
        return None
    message = f"start summary not used: {reason}; every agent was read without it"
    # stale is what a crash leaves; anything else is damage to say out loud
    damaged = start_summary.STALE not in reason
    if damaged:
        message += ". `substrat fsck --repair` rebuilds it, and so does the next clean stop"
    return {"message": message, "damaged": damaged}


def summarize_recovery(data: dict[str, Any]) -> str:
    """A one-line summary of a recovery report (for the log and the CLI)."""
    parts = [plural(data.get("agents", 0), "agent")]
    for key, one, many in (
        ("lost_turns", "turn lost in flight", "turns lost in flight"),
        ("redelivered", "message redelivered", "messages redelivered"),
        ("reconciled", "effect reconciled", "effects reconciled"),
        ("orphans_terminated", "orphan terminated", "orphans terminated"),
        ("cascaded", "cut-short cascade finished", "cut-short cascades finished"),
        ("unrecoverable", "session unrecoverable", "sessions unrecoverable"),
        ("detached", "agent detached", "agents detached"),
        ("quarantined", "record quarantined", "records quarantined"),
        ("records_rebuilt", "record rebuilt", "records rebuilt"),
        ("roots_registered", "root registered", "roots registered"),
        (
            "creations_rebuilt",
            "root creation rebuilt from the registry",
            "root creations rebuilt from the registry",
        ),
        ("lost_roots", "ROOT AGENT LOST", "ROOT AGENTS LOST"),
        ("unreadable", "agent held back (files unreadable)", "agents held back (files unreadable)"),
    ):
        value = data.get(key)
        if value:
            parts.append(plural(len(value), one, many))
    if data.get("summary_used"):
        parts.append(f"{data['summary_used']} from the start summary")
    if data.get("start_summary"):
        parts.append("start summary not used")
    damage = data.get("log_damage") or {}
    if damage:
        total = sum(sum(kinds.values()) for kinds in damage.values())
        parts.append(f"{plural(total, 'damaged log line')} skipped in {plural(len(damage), 'log')}")
    if data.get("registry_problem"):
        parts.append(f"root registry unusable: {data['registry_problem']}")
    return ", ".join(parts)


def logs_behind(report: dict[str, Any]) -> list[str]:
    """A line per log shorter than its checkpoint (entries that were durable are gone)."""
    return [
        f"the log of {endpoint} is shorter than its checkpoint ({why}): entries that were "
        "durable in it are missing (an older copy of the log restored, or writes lost); to "
        "get them back, stop the daemon and restore a newer copy"
        for endpoint, why in sorted((report.get("checkpoints_rejected") or {}).items())
        if why.startswith(LOG_SHORTER)
    ]
