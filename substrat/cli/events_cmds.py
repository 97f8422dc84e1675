"""``substrat watch`` and ``substrat log``: following the daemon's event stream.

The stream survives the daemon: when the connection drops the commands say so
(``connection.lost``), wait for a daemon to answer again, resubscribe
(``connection.restored``) and show the ``daemon.recovered`` notice the new
daemon sends. Heartbeats are always subscribed; a daemon silent for three
heartbeat periods is pinged and, if it does not answer, reported.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import click

from substrat import client as client_mod
from substrat.cli import render
from substrat.cli.common import Opts, daemon_command, emit_json, esc
from substrat.errors import DaemonError, DaemonNotRunningError
from substrat.rpc.methods import EVENT_NAMES

ALWAYS = ("daemon.heartbeat", "daemon.recovered", "daemon.stopping")
RECONNECT_MAX_S = 2.0
SILENT_HEARTBEATS = 3


def stream_events(
    opts: Opts, wanted: list[str] | None, *, reconnect: bool = True
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Events from the daemon, plus local ``connection.lost/restored`` markers."""
    subscribe = sorted(set(wanted) | set(ALWAYS)) if wanted else []
    conn: client_mod.Client | None = None
    first = True
    seen_notices: set[tuple[Any, Any]] = set()
    delay = 0.1
    while True:
        if conn is None:
            try:
                conn = opts.connect() if first else client_mod.Client(opts.root).connect()
                answer = conn.call("events.subscribe", {"events": subscribe})
            except DaemonNotRunningError:
                if first or not reconnect:
                    raise
                time.sleep(delay)
                delay = min(RECONNECT_MAX_S, delay * 2)
                continue
            heartbeat_s = float(answer.get("heartbeat_s", 5.0))
            if not first:
                yield "connection.restored", {"pid": answer.get("pid")}
            first, delay = False, 0.1
        try:
            note = conn.next_notification(heartbeat_s * SILENT_HEARTBEATS)
            if note is None:
                conn.call("ping", timeout_s=min(opts.timeout_s, 10.0))
                continue
        except DaemonError as exc:
            conn.close()
            conn = None
            if not reconnect:
                raise
            yield "connection.lost", {"reason": str(exc).split(";")[0]}
            continue
        name, params = note
        if name == "daemon.recovered":
            key = (params.get("pid"), params.get("at"))
            if key in seen_notices:
                continue
            seen_notices.add(key)
        yield name, params


def _filtered_out(name: str, wanted: list[str] | None) -> bool:
    """Recoveries, shutdowns and connection changes always show: the stream is never silent."""
    if not wanted or name in wanted or name in ALWAYS:
        return False
    return not name.startswith("connection.")


@click.command("watch")
@daemon_command()
@click.option(
    "-e",
    "--event",
    "events",
    multiple=True,
    type=click.Choice(sorted(EVENT_NAMES)),
    help="Only these events (repeatable).",
)
@click.option(
    "--count", type=click.IntRange(min=1), default=None, help="Exit after this many events."
)
@click.option("--heartbeats", is_flag=True, help="Show heartbeats too.")
@click.option("--no-reconnect", is_flag=True, help="Exit when the connection drops.")
def watch(
    opts: Opts, events: tuple[str, ...], count: int | None, heartbeats: bool, no_reconnect: bool
) -> None:
    """Follow the daemon's events: turns, agents, messages, recoveries.

    Reconnects when the daemon restarts, and shows what the restart recovered.
    """
    wanted = list(events) or None
    names: dict[str, str] = {}
    shown = 0
    for name, params in stream_events(opts, wanted, reconnect=not no_reconnect):
        if name == "daemon.heartbeat":
            if not heartbeats:
                continue
        elif _filtered_out(name, wanted):
            continue
        if name == "agent.created":
            names[params["agent_id"]] = params.get("path", params["agent_id"])
        if opts.json:
            emit_json({"event": name, "params": params})
        else:
            opts.out.print(render.event_text(name, params, names))
            if name == "daemon.recovered":
                for line in render.recovery_lines(params, names):
                    opts.out.print(f"    {line}")
            elif name == "connection.lost":
                opts.out.print("    [dim]waiting for the daemon to come back...[/]")
        shown += 1
        if count is not None and shown >= count:
            return


@click.command("log")
@daemon_command()
@click.argument("agent")
@click.option(
    "-n",
    "--limit",
    type=click.IntRange(min=0, max=10_000),
    default=20,
    show_default=True,
    help="How many recent turns to print first.",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing turns as they complete.")
def log(opts: Opts, agent: str, limit: int, follow: bool) -> None:
    """AGENT's conversation, from its event log (completed turns, in order)."""
    history = opts.call("agent.history", {"agent": agent, "limit": limit})
    info = history["agent"]
    if opts.json:
        if not follow:
            emit_json(history)
            return
        for turn in history["turns"]:
            emit_json({"event": "turn", "agent_id": info["agent_id"], **turn})
    else:
        first = history["total"] - len(history["turns"]) + 1
        if not history["turns"]:
            opts.out.print(f"[dim]{esc(info['path'])} has no completed turns yet[/]")
        for offset, turn in enumerate(history["turns"]):
            render.print_turn(opts.out, turn, first + offset)
    if not follow:
        return
    number = history["total"]
    wanted = ["turn.completed", "turn.failed", "agent.terminated"]
    for name, params in stream_events(opts, wanted):
        if name.startswith("connection.") or name == "daemon.recovered":
            if not opts.json:
                opts.out.print(render.event_text(name, params, {}))
            if name == "daemon.recovered":
                _show_lost(opts, params, info["agent_id"])
            continue
        if params.get("agent_id") != info["agent_id"]:
            continue
        if name == "turn.completed":
            number += 1
            turn = {k: params.get(k, "") for k in ("turn_id", "prompt", "response")}
            if opts.json:
                emit_json({"event": "turn", "agent_id": info["agent_id"], **turn})
            else:
                render.print_turn(opts.out, turn, number)
        elif name == "turn.failed":
            if opts.json:
                emit_json({"event": "turn.failed", **params})
            else:
                opts.out.print(
                    f"[red]turn {esc(params.get('turn_id'))} failed:[/] "
                    f"{esc(params.get('error', ''))}"
                )
        elif name == "agent.terminated":
            if not opts.json:
                opts.out.print(f"[magenta]{esc(info['path'])} was terminated[/]")
            return


def _show_lost(opts: Opts, notice: dict[str, Any], agent_id: str) -> None:
    for lost in (notice.get("report") or {}).get("lost_turns", []):
        if lost.get("agent_id") != agent_id:
            continue
        if opts.json:
            emit_json({"event": "turn.lost", **lost})
        else:
            opts.out.print(
                f"[red]turn {esc(lost.get('turn_id'))} was lost in the crash[/] "
                f"(prompt: {esc(render.excerpt(lost.get('prompt', ''), 50))})"
            )
