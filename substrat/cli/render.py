"""Tables, trees and colours for people (``--json`` bypasses all of this)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from substrat.cli.common import esc

STATE_STYLE = {"idle": "green", "busy": "yellow", "waiting": "cyan", "terminated": "red"}
EXCERPT_CHARS = 72


def short(agent_id: object) -> str:
    text = str(agent_id or "")
    return text[:8]


def excerpt(text: object, limit: int = EXCERPT_CHARS) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def state(value: str) -> str:
    return f"[{STATE_STYLE.get(value, 'white')}]{esc(value)}[/]"


def agents_table(agents: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("PATH", "ID", "STATE", "PROVIDER", "CHILDREN", "INBOX"):
        table.add_column(column)
    for a in agents:
        table.add_row(
            esc(a["path"]),
            short(a["agent_id"]),
            state(a["state"]),
            esc(f"{a['provider']}/{a['model']}"),
            str(len(a.get("children") or [])),
            str(a.get("pending_messages", 0)),
        )
    return table


def agent_tree(branches: list[dict[str, Any]]) -> Tree:
    tree = Tree("[bold]agents[/]", guide_style="dim")

    def add(parent: Tree, branch: dict[str, Any]) -> None:
        a = branch["agent"]
        label = f"[bold]{esc(a['name'])}[/] [dim]{short(a['agent_id'])}[/] {state(a['state'])}"
        if a.get("pending_messages"):
            label += f" [cyan]✉ {a['pending_messages']}[/]"
        node = parent.add(label)
        for child in branch.get("children", []):
            add(node, child)

    for branch in branches:
        add(tree, branch)
    return tree


def names_of(agents: list[dict[str, Any]]) -> dict[str, str]:
    """agent id -> path, for showing senders and recipients by name."""
    return {a["agent_id"]: a["path"] for a in agents}


def endpoint(value: object, names: dict[str, str]) -> str:
    text = str(value)
    return names.get(text, text if text == "user" else short(text))


def messages_table(messages: list[dict[str, Any]], names: dict[str, str]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("FROM", "KIND", "ID", "MESSAGE"):
        table.add_column(column)
    for m in messages:
        table.add_row(
            esc(endpoint(m["sender"], names)),
            esc(m["kind"]),
            short(m["message_id"]),
            esc(excerpt(m["payload"])),
        )
    return table


def print_turn(console: Console, turn: dict[str, Any], index: int | None = None) -> None:
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
    lines.append(
        f"agents back: [bold]{report.get('agents', 0)}[/] ({report.get('roots', 0)} roots)"
    )
    for lost in report.get("lost_turns", []):
        who = endpoint(lost.get("agent_id"), names)
        lines.append(
            f"[red]lost in flight:[/] {esc(who)} turn {esc(lost.get('turn_id'))} "
            f"(prompt: {esc(excerpt(lost.get('prompt', ''), 40))})"
        )
    for key, label in (
        ("redelivered", "messages redelivered"),
        ("reconciled", "effects reconciled"),
        ("orphans_terminated", "orphan sessions terminated"),
        ("cascaded", "cut-short terminations finished"),
        ("records_rebuilt", "session records rebuilt"),
        ("unrecoverable", "sessions unrecoverable"),
        ("detached", "agents detached from a lost parent"),
    ):
        items = report.get(key) or []
        if items:
            lines.append(f"{label}: [bold]{len(items)}[/]")
    for q in report.get("quarantined", []):
        lines.append(f"[yellow]quarantined:[/] {esc(q.get('name'))} ({esc(q.get('reason'))})")
    damage = report.get("log_damage") or {}
    for sid, kinds in damage.items():
        text = ", ".join(f"{k}={v}" for k, v in sorted(kinds.items()))
        lines.append(f"[yellow]log damage skipped[/] in {short(sid)}: {esc(text)}")
    repairs = report.get("log_repairs") or {}
    if repairs:
        lines.append(f"logs repaired on open: [bold]{len(repairs)}[/]")
    return lines


EVENT_STYLE = {
    "turn.started": "yellow",
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
}


def event_text(name: str, params: dict[str, Any], names: dict[str, str]) -> str:
    """One line per event (markup)."""
    style = EVENT_STYLE.get(name, "white")
    agent = endpoint(params.get("agent_id", ""), names) if params.get("agent_id") else ""
    if name == "turn.completed":
        body = f"{agent} {params.get('turn_id')}: {excerpt(params.get('response', ''))}"
    elif name in ("turn.started", "turn.failed"):
        body = f"{agent} {params.get('turn_id')} {params.get('error', '')}".rstrip()
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
        body = f"{len(ids)} to {endpoint(params.get('recipient'), names)}"
    elif name == "daemon.heartbeat":
        body = (
            f"pid {params.get('pid')} up {params.get('uptime_s')}s, {params.get('agents')} agents"
        )
    elif name == "daemon.recovered":
        report = params.get("report") or {}
        body = (
            f"pid {params.get('pid')} after {params.get('previous_shutdown')} shutdown: "
            f"{report.get('agents', 0)} agents, {len(report.get('lost_turns', []))} lost turns, "
            f"{len(report.get('redelivered', []))} redelivered"
        )
    else:
        body = " ".join(f"{k}={v}" for k, v in params.items())
    text = Text(body)
    return f"[{style}]{name:<18}[/] {esc(text.plain)}"
