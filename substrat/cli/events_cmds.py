"""``substrat watch`` and ``substrat log``: following the daemon's event stream.

The stream survives the daemon: when the connection drops the commands say so
(``connection.lost``), wait for a daemon to answer again, resubscribe, and
show the ``daemon.recovered`` notice the new daemon sends, then
``connection.restored``: in the order they happened (the recovery ran before
the new daemon answered), every line with its time. Heartbeats are always
subscribed; a daemon silent for three heartbeat periods is pinged and, if it
does not answer, reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from substrat import client as client_mod
from substrat.cli.common import Opts, daemon_command, emit_json, esc, lazy_module
from substrat.errors import DaemonError, DaemonNotRunningError, RpcError
from substrat.rpc.protocol import EVENT_NAMES
from substrat.timestamps import utc_now_iso
from substrat.words import plural

if TYPE_CHECKING:
    from substrat.cli import lines
else:
    lines = lazy_module("substrat.cli.lines")  # loaded when a line says something

ALWAYS = ("daemon.heartbeat", "daemon.recovered", "daemon.stopping")
Event = tuple[str, dict[str, Any]]
RECONNECT_MAX_S = 0.5
"""The longest wait between reconnection attempts: an attempt is one connect() on the
socket, so a short cap costs nothing and shows the restarted daemon's report sooner."""
SILENT_HEARTBEATS = 3


def stream_events(
    opts: Opts,
    wanted: list[str] | None,
    *,
    reconnect: bool = True,
    follow_restarts: bool = False,
    on_subscribed: Callable[[client_mod.Client, bool], None] | None = None,
    catch_up: Callable[[client_mod.Client, list[Event]], list[Event]] | None = None,
) -> Iterator[Event]:
    """Events from the daemon, plus local ``connection.lost/restored`` markers.

    ``on_subscribed(client, reconnected)`` runs right after each subscription,
    so a caller can read state knowing no later event will be missed;
    ``catch_up(client, replayed)``, after a reconnect, gives what to show between
    the new daemon's replayed notices and ``connection.restored``. A
    daemon that stops cleanly (it says ``daemon.stopping`` first) ends the
    stream, unless ``follow_restarts``; one that dies is waited for. Local
    markers carry a ``time`` like the daemon's events.
    """

    subscribe = sorted(set(wanted) | set(ALWAYS)) if wanted else []
    conn: client_mod.Client | None = None
    first = True
    seen_notices: set[tuple[Any, Any]] = set()
    delay = 0.1

    def fresh(note: tuple[str, dict[str, Any]]) -> bool:
        """False for a recovery notice already shown (a daemon replays it per subscription)."""
        name, params = note
        if name != "daemon.recovered":
            return True
        key = (params.get("pid"), params.get("at"))
        if key in seen_notices:
            return False
        seen_notices.add(key)
        return True

    while True:
        if conn is None:
            replayed: list[Event] = []
            caught: list[Event] = []
            try:
                conn = opts.connect() if first else client_mod.Client(opts.root).connect()
                answer = conn.call("events.subscribe", {"events": subscribe})
                # What the daemon sent before answering: its daemon.recovered, about a
                # recovery that ran before this connection, so shown before
                # connection.restored (in the order things happened, as the times say).
                replayed = conn.received_notifications()
                if on_subscribed is not None:
                    on_subscribed(conn, not first)
                if catch_up is not None and not first:
                    caught = catch_up(conn, replayed)
                restored_at = utc_now_iso()  # after the catch-up: the times never go back
            except (DaemonNotRunningError, DaemonError) as exc:
                stopped = conn is not None and conn.daemon_stopping
                said = replayed + ([] if conn is None else conn.received_notifications())
                if conn is not None:
                    conn.close()
                    conn = None
                if stopped:
                    # A clean stop between the subscription and the catch-up: show what the
                    # daemon said before it went (its daemon.stopping) and end as on any
                    # clean stop, not with the error of the interrupted catch-up.
                    yield from filter(fresh, said)
                    if not follow_restarts:
                        return
                    if not reconnect:
                        raise
                    yield (
                        "connection.lost",
                        {"reason": str(exc).split(";")[0], "time": utc_now_iso()},
                    )
                    first = False
                    continue
                if first or not reconnect or isinstance(exc, RpcError):
                    raise
                time.sleep(delay)
                delay = min(RECONNECT_MAX_S, delay * 2)
                continue
            heartbeat_s = float(answer.get("heartbeat_s", 5.0))
            yield from filter(fresh, replayed)
            yield from caught
            if not first:
                yield "connection.restored", {"pid": answer.get("pid"), "time": restored_at}
            first, delay = False, 0.1
        try:
            note = conn.next_notification(heartbeat_s * SILENT_HEARTBEATS)
            if note is None:
                conn.call("ping", timeout_s=min(opts.timeout_s, 10.0))
                continue
        except DaemonError as exc:
            stopped = conn.daemon_stopping
            conn.close()
            conn = None
            if stopped and not follow_restarts:
                return  # a clean stop: nothing more will come
            if not reconnect:
                raise
            yield "connection.lost", {"reason": str(exc).split(";")[0], "time": utc_now_iso()}
            continue
        if fresh(note):
            yield note


def _filtered_out(name: str, wanted: list[str] | None) -> bool:
    """Recoveries, shutdowns and connection changes always show: the stream is never silent."""
    if not wanted or name in wanted or name in ALWAYS or name == "daemon.started":
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
@click.option("--no-reconnect", is_flag=True, help="Exit (status 3) when the connection drops.")
@click.option(
    "--follow-restarts",
    is_flag=True,
    help="Keep watching after a clean daemon stop, until a daemon answers again. After "
    "each reconnect, the turns the agents ran meanwhile are caught up from their logs "
    "(marked caught up), and a connection.gap line says which other events may be missing.",
)
def watch(
    opts: Opts,
    events: tuple[str, ...],
    count: int | None,
    heartbeats: bool,
    no_reconnect: bool,
    follow_restarts: bool,
) -> None:
    """Follow the daemon's events: turns, tool calls, agents, messages, recoveries.

    Each line starts with the event's time. When the daemon dies, watch
    waits for it, reconnects and shows what the restart recovered; when it
    stops cleanly, watch ends (exit 0) unless --follow-restarts. After a
    reconnect it shows the turns run while it was away from the agents' logs.
    """
    from substrat.cli import watch_gap

    wanted = list(events) or None
    names: dict[str, str] = {}
    shown = 0
    seen = watch_gap.Shown(started=utc_now_iso())  # nothing before it is caught up

    def learn_names(conn: client_mod.Client, _reconnected: bool) -> None:
        if not opts.json:  # agents by path in the lines printed for people
            names.update(lines.names_of(conn.call("agent.list")))

    def catch_up(conn: client_mod.Client, replayed: list[Event]) -> list[Event]:
        """What the daemon did before this watch was back: how it started (the notice a
        clean start does not send), the gap, and the turns of the gap from the logs."""
        out: list[Event] = []
        if not any(name == "daemon.recovered" for name, _ in replayed):
            status = conn.call("daemon.status")
            started = {k: status.get(k) for k in ("pid", "previous_shutdown", "agents")}
            out.append(("daemon.started", {**started, "time": status.get("started_at")}))
        back = utc_now_iso()  # subscribed: from here on events come live
        agents = conn.call("agent.list", {"all": True})
        since = str(seen.last_time)
        found = [
            e
            for e in watch_gap.missed(opts.root, since, agents, seen.started)
            if not _filtered_out(e[0], wanted) and seen.first_time(*e)
        ]
        gap = {"from": since, "to": back, "caught_up": len(found)}
        return [*out, ("connection.gap", {**gap, "time": gap["to"]}), *found]

    stream = stream_events(
        opts,
        wanted,
        reconnect=not no_reconnect,
        follow_restarts=follow_restarts,
        on_subscribed=learn_names,
        catch_up=catch_up,
    )
    for name, params in stream:
        seen.received(name, params)
        if params.get("caught_up") is not True and not seen.first_time(name, params):
            continue  # shown already, caught up from its log
        if name == "daemon.heartbeat":
            if not heartbeats:
                continue
        elif _filtered_out(name, wanted):
            continue
        if name == "agent.created":
            names[params["agent_id"]] = str(params.get("path", params["agent_id"]))
        if opts.json:
            emit_json({"event": name, "params": params})
        else:
            opts.out.print(lines.event_text(name, params, names))
            if name == "daemon.recovered":
                for line in lines.recovery_lines(params, names):
                    opts.out.print(f"    {line}")
            elif name == "connection.lost":
                opts.out.print("    [dim]waiting for the daemon to come back...[/]")
            elif name == "daemon.stopping" and not follow_restarts:
                opts.out.print("    [dim]the daemon is stopping cleanly; watch ends with it[/]")
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
@click.option(
    "--follow-restarts",
    is_flag=True,
    help="With --follow: keep following after a clean daemon stop.",
)
def log(opts: Opts, agent: str, limit: int, follow: bool, follow_restarts: bool) -> None:
    """AGENT's conversation, from its event log (completed turns, in order).

    AGENT may be terminated: its log is kept. With --follow it ends when the
    agent is terminated or the daemon stops cleanly (unless --follow-restarts);
    after a crash it waits for the daemon and catches up.

    With --follow it subscribes before reading the history, so no turn falls
    in between, and catches up from the log after a daemon restart.
    """
    printed: set[str] = set()
    state: dict[str, Any] = {"number": 0}

    def show(turn: dict[str, Any], number: int) -> None:
        printed.add(turn["turn_id"])
        if opts.json:
            emit_json({"event": "turn", "agent_id": state["agent_id"], "number": number, **turn})
        else:
            lines.print_turn(opts.out, turn, number)

    def catch_up(conn: client_mod.Client, reconnected: bool) -> None:
        want = 10_000 if reconnected else limit
        history = conn.call("agent.history", {"agent": state.get("agent_id", agent), "limit": want})
        state["agent_id"], state["path"] = history["agent"]["agent_id"], history["agent"]["path"]
        gone = history.get("deleted_through", 0)
        if gone and not opts.json and not reconnected:
            opts.out.print(
                f"[dim]entries 1-{gone} of {esc(state['path'])}'s log were deleted by the "
                "compaction policy: the turns they held are kept (in the log's base), their "
                "other events are gone[/]"
            )
        missing = history.get("missing") or []
        if missing and not opts.json and not reconnected:
            ranges = ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in missing)
            opts.out.print(
                f"[yellow]entries {ranges} of {esc(state['path'])}'s log are missing (lost to "
                "damage: see `substrat fsck`): turns they held are not shown[/]"
            )
        first = history["total"] - len(history["turns"]) + 1
        if first > 1 and not opts.json and not reconnected:
            # Said before the turns: after a compaction notice a reader would
            # otherwise take the first turn shown for the first one kept.
            opts.out.print(
                f"[dim]{plural(first - 1, 'earlier turn')} not shown "
                f"(the last {len(history['turns'])} of {history['total']}; -n N shows more)[/]"
            )
        # After a reconnect only what completed meanwhile: the turns -n left out stay out.
        known = state["number"] if reconnected else 0
        for offset, turn in enumerate(history["turns"]):
            if first + offset > known and turn["turn_id"] not in printed:
                show(turn, first + offset)
        state["number"] = history["total"]
        if not history["total"] and not opts.json and not reconnected:
            opts.out.print(f"[dim]{esc(state['path'])} has no completed turns yet[/]")

    if follow and opts.call("agent.show", {"agent": agent})["agent"]["state"] == "terminated":
        follow = False  # nothing more will come: print what the log has, and end
    if not follow:
        if opts.json:  # one document: the agent, the total, the turns
            emit_json(opts.call("agent.history", {"agent": agent, "limit": limit}))
            return
        with opts.connect() as conn:
            catch_up(conn, False)
        return
    wanted = ["turn.completed", "turn.failed", "agent.terminated"]
    stream = stream_events(opts, wanted, follow_restarts=follow_restarts, on_subscribed=catch_up)
    for name, params in stream:
        if name.startswith("connection.") or name == "daemon.recovered":
            if opts.json:  # a script sees the restart too, in the lines watch --json prints
                emit_json({"event": name, "params": params})
            else:
                opts.out.print(lines.event_text(name, params, {}))
            if name == "daemon.recovered":
                _show_lost(opts, params, state["agent_id"])
            continue
        if params.get("agent_id") != state["agent_id"]:
            continue
        if name == "turn.completed" and params.get("turn_id") not in printed:
            state["number"] += 1
            turn = {k: params.get(k, "") for k in ("turn_id", "prompt", "response")}
            show(turn, state["number"])
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
                opts.out.print(f"[magenta]{esc(state['path'])} was terminated[/]")
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
                f"(prompt: {esc(lines.lost_prompt(lost, 50))})"
            )
