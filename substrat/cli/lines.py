"""Text for people, as rich markup: ids, states, turns, events, what a recovery did.

No rich here: these lines are strings that :class:`substrat.cli.output.Output` prints
without rich into a pipe or a file; tables and trees, which only rich draws, are in
:mod:`substrat.cli.render`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from substrat.cli.common import esc
from substrat.cli.output import Output
from substrat.words import plural

STATE_STYLE = {"idle": "green", "busy": "yellow", "waiting": "cyan", "terminated": "red"}


EXCERPT_CHARS = 72


def short(agent_id: object) -> str:
    """An id as ``list`` and ``tree`` show it: a prefix every command accepts."""
    text = str(agent_id or "")
    from substrat.agent_refs import SHORT_ID_CHARS  # (difflib, for the daemon's advice)

    return text[:SHORT_ID_CHARS]


def excerpt(text: object, limit: int = EXCERPT_CHARS) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def state(value: str) -> str:
    return f"[{STATE_STYLE.get(value, 'white')}]{esc(value)}[/]"


def names_of(agents: list[dict[str, Any]]) -> dict[str, str]:
    """agent id -> path, for showing senders and recipients by name."""
    return {a["agent_id"]: a["path"] for a in agents}


def endpoint(value: object, names: dict[str, str]) -> str:
    text = str(value)
    return names.get(text, text if text == "user" else short(text))


def lost_prompt(lost: dict[str, Any], chars: int) -> str:
    """A lost turn's prompt as its sender wrote it: without the notice of an earlier lost
    turn that substrat put before it (two crashes in a row)."""
    from substrat.lost_notice import user_prompt

    return excerpt(user_prompt(str(lost.get("prompt", ""))), chars)


def print_turn(console: Output, turn: dict[str, Any], index: int | None = None) -> None:
    head = f"turn {turn['turn_id']}" + (f" (#{index})" if index is not None else "")
    console.print(f"[bold blue]── {esc(head)}[/]")
    console.print(f"[green]>[/] {esc(turn['prompt'])}")
    console.print(esc(turn["response"]))


def recovery_lines(notice: dict[str, Any] | None, names: dict[str, str] | None = None) -> list[str]:
    """What a recovery did, in a few lines (markup)."""
    if not notice:
        return ["[green]nothing to recover[/]"]
    names = names or {}
    report = notice.get("report", notice)
    lines = []
    shutdown = notice.get("previous_shutdown")
    if shutdown == "unclean":
        lines.append("[bold yellow]the previous daemon died without shutting down[/]")
    elif shutdown == "recovered":
        lines.append("the previous daemon died; the root was recovered offline since")
    lines.append(
        f"agents back: [bold]{report.get('agents', 0)}[/] "
        f"({plural(report.get('roots', 0), 'root')})"
    )
    for lost in report.get("lost_turns", []):
        who = endpoint(lost.get("agent_id"), names)
        what = "outcome unknown" if lost.get("record_damaged") else "lost in flight"
        lines.append(
            f"[red]{what}:[/] {esc(who)} turn {esc(lost.get('turn_id'))} "
            f"(prompt: {esc(lost_prompt(lost, 40))})"
            + (" [dim](a damaged line follows its start)[/]" if lost.get("record_damaged") else "")
        )
    for key, label in (
        ("redelivered", "messages redelivered"),
        ("reconciled", "effects reconciled"),
        ("orphans_terminated", "orphan sessions terminated"),
        ("cascaded", "cut-short terminations finished"),
        ("records_rebuilt", "session records rebuilt"),
        ("unrecoverable", "sessions unrecoverable"),
        ("detached", "agents detached from a lost parent"),
        ("roots_registered", "roots registered from their logs"),
        ("creations_rebuilt", "root creations rebuilt from the registry"),
    ):
        items = report.get(key) or []
        if items:
            lines.append(f"{label}: [bold]{len(items)}[/]")
    lines += problem_lines(report)
    for q in report.get("quarantined", []):
        lines.append(quarantine_line(q))
    damage = report.get("log_damage") or {}
    if damage:
        from substrat.session.model import is_session_id  # (orjson, the session package)
    for sid, kinds in damage.items():
        text = ", ".join(f"{k}={v}" for k, v in sorted(kinds.items()))
        who = short(sid) if is_session_id(sid) else sid  # "checkpoints", not "checkpoi"
        lines.append(f"[yellow]log damage skipped[/] in {esc(who)}: {esc(text)}")
    repairs = report.get("log_repairs") or {}
    if repairs:
        lines.append(f"logs repaired on open: [bold]{len(repairs)}[/]")
    if report.get("checkpoints_set_aside"):
        lines.append(
            "[yellow]checkpoints set aside, every log read from its start:[/] "
            f"{esc(report['checkpoints_set_aside'])}"
        )
    return lines


def quarantine_line(item: dict[str, Any]) -> str:
    """What happened to a record or directory recovery could not load (markup): moved to
    quarantine/, or, a directory whose name is not a session's, left where it is."""
    name, reason = esc(item.get("name")), esc(item.get("reason"))
    if item.get("kind") == "nested_root":  # another root: never moved (session.store)
        return f"[yellow]left in place:[/] agents/{name} ({reason})"
    if item.get("moved_to"):
        return (
            f"[yellow]quarantined:[/] {name}'s record, moved to {esc(item['moved_to'])} ({reason})"
        )
    return (
        f"[yellow]left in place:[/] agents/{name} ({reason}; `substrat fsck --repair` moves it "
        "to quarantine/)"
    )


def problem_lines(report: dict[str, Any]) -> list[str]:
    """Lost roots, agents held back, an unusable registry, open incidents: each with what
    to do (markup)."""
    lines = []
    for lost in report.get("lost_roots") or []:
        lines.append(f"[bold red]lost root agent:[/] {esc(lost.get('what_to_do'))}")
    for item in report.get("unreadable") or []:
        head = "held back" if item.get("held_by") else f"unreadable ({esc(item.get('error'))})"
        who = (
            esc(item.get("name")) if item.get("name") else f"agent {short(item.get('session_id'))}"
        )
        lines.append(
            f"[bold red]{head}:[/] {who} at {esc(item.get('path'))}; {esc(item.get('what_to_do'))}"
        )
    if report.get("registry_problem"):
        lines.append(f"[bold red]root registry unusable:[/] {esc(report['registry_problem'])}")
    for incident in report.get("incidents") or []:  # open until acknowledged (substrat.incidents)
        lines.append(f"[bold red]open incident:[/] {esc(incident.get('message'))}")
    if report.get("read_only"):
        lines.append(
            "[yellow]read-only file system:[/] this is what recovery would do; it can run "
            "only once the root is remounted read-write"
        )
    return lines


EVENT_STYLE = {
    "turn.started": "yellow",
    "turn.tool": "cyan",
    "turn.retrying": "yellow",
    "turn.completed": "green",
    "turn.failed": "red",
    "agent.created": "cyan",
    "agent.terminated": "magenta",
    "message.enqueued": "blue",
    "message.delivered": "blue",
    "daemon.recovered": "bold yellow",
    "daemon.heartbeat": "dim",
    "daemon.stopping": "bold magenta",
    "connection.lost": "bold red",
    "connection.restored": "bold green",
    "connection.gap": "bold yellow",
    "daemon.started": "bold yellow",
}


NAME_WIDTH = max(map(len, EVENT_STYLE))
"""Event names padded to the longest, so the lines' bodies start in one column."""


def clock(params: dict[str, Any]) -> str:
    """The event's time as HH:MM:SS in local time ("--:--:--" when it has none)."""
    stamp = params.get("time") or params.get("at")
    try:
        return datetime.fromisoformat(str(stamp)).astimezone().strftime("%H:%M:%S")
    except ValueError:
        return "--:--:--"


def tool_call(params: dict[str, Any]) -> str:
    """``send_message(recipient=scout, text=map it) → sent message ... to lead/scout``."""
    args = params.get("arguments") or {}
    shown = ", ".join(f"{k}={excerpt(v, 40)}" for k, v in args.items())
    return f"{params.get('tool')}({shown}) → {excerpt(params.get('result', ''), 60)}"


def event_text(name: str, params: dict[str, Any], names: dict[str, str]) -> str:
    """One line per event, starting with its time (markup)."""
    style = EVENT_STYLE.get(name, "white")
    agent = endpoint(params.get("agent_id", ""), names) if params.get("agent_id") else ""
    turn = params.get("turn_id")
    if name == "turn.completed":
        body = f"{agent} {turn}: {excerpt(params.get('response', ''))}"
    elif name in ("turn.started", "turn.failed"):
        body = f"{agent} {turn} {params.get('error', '')}".rstrip()
    elif name == "turn.tool":
        body = f"{agent} {turn} {tool_call(params)}"
    elif name == "turn.retrying":
        body = (
            f"{agent} {turn} attempt {params.get('attempt')}/{params.get('max_retries')} "
            f"in {params.get('delay_s')}s: {params.get('error')}"
        )
    elif name == "agent.created":
        body = f"{params.get('path')} ({short(params.get('agent_id'))})"
    elif name == "agent.terminated":
        body = f"{params.get('name')} ({short(params.get('agent_id'))})"
    elif name == "message.enqueued":
        body = (
            f"{endpoint(params.get('sender'), names)} → {endpoint(params.get('recipient'), names)}"
            f" [{params.get('kind')}] {excerpt(params.get('payload', ''), 48)}"
        )
    elif name == "message.delivered":
        ids = params.get("message_ids") or []
        body = f"{plural(len(ids), 'message')} to {endpoint(params.get('recipient'), names)}"
    elif name == "daemon.heartbeat":
        body = (
            f"pid {params.get('pid')} up {params.get('uptime_s')}s, "
            f"{plural(params.get('agents') or 0, 'agent')}"
        )
    elif name == "daemon.recovered":
        report = params.get("report") or {}
        body = (
            f"pid {params.get('pid')} after {params.get('previous_shutdown')} shutdown: "
            f"{plural(report.get('agents', 0), 'agent')}, "
            f"{plural(len(report.get('lost_turns', [])), 'lost turn')}, "
            f"{len(report.get('redelivered', []))} redelivered"
        )
    elif name in ("daemon.stopping", "connection.lost"):
        body = str(params.get("reason", ""))
    elif name == "connection.restored":
        body = f"pid {params.get('pid')}"
    elif name == "connection.gap":
        body = gap_text(params)
    elif name == "daemon.started":
        body = (
            f"pid {params.get('pid')} after {params.get('previous_shutdown')} shutdown: "
            f"{plural(params.get('agents') or 0, 'agent')}, nothing to recover"
        )
    else:
        body = " ".join(f"{k}={v}" for k, v in params.items() if k != "time")
    if params.get("caught_up") is True:  # (a gap's caught_up is a count)
        body += " (caught up from its log)"
    return f"[dim]{clock(params)}[/] [{style}]{name:<{NAME_WIDTH}}[/] {esc(body)}"


def gap_text(params: dict[str, Any]) -> str:
    """What watch may have missed while it reconnected, and where it is."""
    span = f"{clock({'time': params.get('from')})} and {clock({'time': params.get('to')})}"
    caught = plural(params.get("caught_up") or 0, "turn event")
    return (
        f"events between {span} may be missing: {caught} caught up from the agents' logs "
        "follow; other events of that time (messages, tool calls) are not shown again"
    )
