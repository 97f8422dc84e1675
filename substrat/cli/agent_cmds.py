"""``substrat agent create|send|list|tree|show|rm`` and ``substrat inbox``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from substrat.cli.common import (
    LazyChoice,
    Opts,
    daemon_command,
    emit_json,
    esc,
    for_terminal,
    group_options,
    lazy_module,
)
from substrat.cli.turns import PromptCommand, TurnView, read_prompt
from substrat.errors import BadInputError, DaemonError
from substrat.provider_names import BUILTIN, DAEMON_ONLY
from substrat.words import plural, when

if TYPE_CHECKING:
    from substrat.cli import lines, render
else:
    render = lazy_module("substrat.cli.render")  # rich, loaded when something is drawn
    lines = lazy_module("substrat.cli.lines")  # loaded when a line says something

SEND_TIMEOUT_S = 600.0


def _provider_names() -> list[str]:
    from substrat.providers.registry import provider_names

    return provider_names()


@click.group("agent")
@group_options
def agent_group(group_root: Path | None, group_json: bool) -> None:
    """Create agents, send them turns, look at them, remove them.

    AGENT is an agent's path (lead/worker), its id, or a unique prefix of the
    id (at least 4 characters; the 8 that list and tree print will do).
    """


@agent_group.command("create")
@daemon_command(creates_root=True)
@click.argument("name")
@click.option("-i", "--instructions", default="", help="The agent's system prompt.")
@click.option(
    "--provider",
    type=LazyChoice(_provider_names, sure=(*BUILTIN, *DAEMON_ONLY)),
    default="scripted",
    show_default=True,
    help="Which backend runs the agent (README: Providers).",
)
@click.option("--model", default=None, help="Model (default: the provider's).")
def create(opts: Opts, name: str, instructions: str, provider: str, model: str | None) -> None:
    """Create a root agent called NAME."""
    _check_create(opts, name, provider, model)
    info = opts.call(
        "agent.create",
        {"name": name, "instructions": instructions, "provider": provider, "model": model},
    )
    if opts.json:
        emit_json(info)
    else:
        opts.out.print(
            f"created [bold]{esc(info['path'])}[/] ({info['agent_id']}) "
            f"with {esc(info['provider'])}/{esc(info['model'])}"
        )


def _check_create(opts: Opts, name: str, provider: str, model: str | None) -> None:
    """Refuse, before a daemon is started or a root made, what the daemon would refuse.

    The name always (BadInputError, exit 2: nothing sent); on a new root also the model,
    asked of the provider as the new daemon would ask it (it starts from this shell, with
    this environment; an existing root's daemon has its own, so it alone judges there).
    """
    from substrat.agent_names import validate_name

    try:
        validate_name(name)
    except ValueError as exc:
        raise BadInputError(f"{exc}; nothing was created") from None
    if not opts.new_root:
        return
    from substrat.daemon_providers import build_registry
    from substrat.providers.base import new_agent_model

    try:
        backend = build_registry().get(provider)
    except Exception:  # the daemon fails to build it too, and says why in its words
        return
    try:
        new_agent_model(backend, model)
    except ValueError as exc:
        raise BadInputError(f"{exc}; no root was made at {opts.root}") from None


@agent_group.command("send", cls=PromptCommand)
@daemon_command(SEND_TIMEOUT_S)
@click.argument("agent")
@click.argument("prompt")
@click.option("--no-stream", is_flag=True, help="Print the response only once it is committed.")
@click.option(
    "--wait",
    is_flag=True,
    help="If AGENT is running a turn, or the daemon runs as many turns as it may at once "
    "(daemon start --max-turns), wait instead of failing.",
)
def send(opts: Opts, agent: str, prompt: str, no_stream: bool, wait: bool) -> None:
    """Send PROMPT to AGENT and print its response as it streams ('-' reads stdin).

    The text streams as the model writes it; the turn counts only once it is
    committed (durably logged), which a final line on stderr confirms. If the
    daemon dies or the provider fails first, that line says the text above
    was not committed, and the command exits non-zero. With --json nothing
    streams: the committed turn is printed once it is durable. A PROMPT that
    starts with '-' goes after '--': substrat agent send lead -- "--help me".
    """
    prompt = read_prompt(prompt)
    stream = not (no_stream or opts.json)
    with opts.connect() as conn, TurnView(opts.out, opts.err, agent) as view:
        try:
            result = conn.call(
                "agent.send",
                {
                    "agent": agent,
                    "prompt": prompt,
                    "stream": stream,
                    "progress": stream,
                    "wait": wait,
                },
                on_notification=view.on_notification if stream else None,
                on_silence=opts.frozen_check(),
            )
        except DaemonError as exc:
            if not opts.json:
                view.not_committed(exc)
            raise
        except KeyboardInterrupt:
            if not opts.json:
                view.detached()
            raise
        if opts.json:
            emit_json(result)
            return
        if not stream:
            click.echo(for_terminal(result["response"]), nl=not result["response"].endswith("\n"))
        view.committed(result)


@agent_group.command("list")
@daemon_command()
@click.option(
    "-a",
    "--all",
    "show_all",
    is_flag=True,
    help="Also list terminated agents (their logs are kept).",
)
@click.option(
    "-q", "--quiet", is_flag=True, help="Print only the short ids, one per line (for scripts)."
)
def list_agents(opts: Opts, show_all: bool, quiet: bool) -> None:
    """List the live agents (with --all, the terminated ones too)."""
    agents = opts.call("agent.list", {"all": show_all})
    # agents the start could not use are not gone: say so where every agent is listed
    # (and without --all, count them: "no agents yet" after a start on a full disk read
    # as if they were gone)
    asks = not quiet and (show_all or not opts.json)
    held = (opts.call("daemon.status").get("unreadable") or []) if asks else []
    if quiet:
        for a in agents:
            click.echo(lines.short(a["agent_id"]))
    elif opts.json:
        emit_json(agents + [_held_entry(item) for item in held])
    elif agents:
        opts.out.print(render.agents_table(agents, opts.out.width))
    elif not held:
        opts.out.print("no agents yet: [bold]substrat agent create NAME[/]")
    if not (quiet or opts.json) and held and not show_all:
        opts.out.print(
            f"[yellow]{plural(len(held), 'agent')} held back since the daemon started "
            "(files it could not use): `substrat agent list --all` says which and what "
            "to do[/]"
        )
    elif not (quiet or opts.json):
        for item in held:
            who = item.get("name") or lines.short(item["session_id"])
            opts.out.print(
                f"[yellow]held back: {esc(who)} (session {lines.short(item['session_id'])}): "
                f"{esc(item['error'])}; {esc(item['what_to_do'])}[/]"
            )


def _held_entry(item: dict[str, Any]) -> dict[str, Any]:
    """A held agent in ``list --all --json``: the keys of a listed agent (null where only
    its unreadable files know it), state ``held``, and why (``daemon status``'s entry)."""
    keys = ("agent_id", "parent_id", "path", "provider", "model", "instructions")
    return {
        **dict.fromkeys(keys),
        "session_id": item["session_id"],
        "name": item.get("name"),
        "state": "held",
        "children": [],
        "pending_messages": None,
        "terminated_at": None,
        "held": {
            "error": item["error"],
            "what_to_do": item["what_to_do"],
            "held_by": item.get("held_by"),
        },
    }


@agent_group.command("tree")
@daemon_command()
def tree(opts: Opts) -> None:
    """Show the agents as a tree."""
    branches = opts.call("agent.tree")
    if opts.json:
        emit_json(branches)
    else:
        opts.out.print(render.agent_tree(branches))


@agent_group.command("show")
@daemon_command()
@click.argument("agent")
def show(opts: Opts, agent: str) -> None:
    """Everything about AGENT: state, inbox, recent turns, a turn lost in a crash."""
    with opts.connect() as conn:
        info = conn.call("agent.show", {"agent": agent})
        names = lines.names_of(conn.call("agent.list", {"all": True}))
    if opts.json:
        emit_json(info)
        return
    out = opts.out
    a = info["agent"]
    out.print(f"[bold]{esc(a['path'])}[/]  {a['agent_id']}  {lines.state(a['state'])}")
    if a.get("terminated_at"):
        out.print(
            f"  [red]terminated at {esc(when(a['terminated_at']))}[/]; its log is kept "
            f"(`substrat log {esc(a['path'])}`)"
        )
    out.print(f"  session {a['session_id']}  provider {esc(a['provider'])}/{esc(a['model'])}")
    if a.get("instructions"):
        out.print(f"  instructions: {esc(lines.excerpt(a['instructions']))}")
    parent = lines.endpoint(a["parent_id"], names) if a.get("parent_id") else "-"
    children = ", ".join(lines.endpoint(c, names) for c in a.get("children", [])) or "-"
    out.print(f"  parent {esc(parent)}  children {esc(children)}")
    out.print(f"  turns {info['turns']}  live session: {'yes' if info.get('live') else 'no'}")
    if info.get("waiting_on"):
        out.print(f"  [cyan]waiting on {plural(len(info['waiting_on']), 'reply', 'replies')}[/]")
    if info.get("lost_turn"):
        lost = info["lost_turn"]
        out.print(
            f"  [red]lost in a crash:[/] turn {esc(lost.get('turn_id'))} "
            f"({esc(lines.lost_prompt(lost, 50))}); it is told at its next turn"
        )
    if info.get("inbox"):
        out.print("[bold]inbox[/]")
        out.print(render.messages_table(info["inbox"], names, out.width))
    for turn in info.get("recent_turns", []):
        lines.print_turn(out, turn)


@agent_group.command("rm")
@daemon_command()
@click.argument("agent")
@click.option("--cascade", is_flag=True, help="Also terminate its children (leaves first).")
def rm(opts: Opts, agent: str, cascade: bool) -> None:
    """Terminate AGENT (durably; its log is kept)."""
    result = opts.call("agent.terminate", {"agent": agent, "cascade": cascade})
    if opts.json:
        emit_json(result)
    else:
        names = result.get("paths") or [lines.short(i) for i in result["terminated"]]
        opts.out.print(f"terminated {plural(len(names), 'agent')}: {esc(', '.join(names))}")


@click.command("inbox")
@daemon_command()
@click.option("--collect", is_flag=True, help="Mark the shown messages as read (removes them).")
def inbox(opts: Opts, collect: bool) -> None:
    """Messages agents sent to you (replies, results, errors)."""
    with opts.connect() as conn:
        messages = conn.call("inbox.list")["messages"]
        names = lines.names_of(conn.call("agent.list"))
        acked: list[str] = []
        if collect and messages:
            ids = [m["message_id"] for m in messages]
            acked = conn.call("inbox.ack", {"message_ids": ids})["acknowledged"]
    if opts.json:
        emit_json({"messages": messages, "acknowledged": acked})
        return
    if not messages:
        opts.out.print("inbox empty")
        return
    opts.out.print(render.messages_table(messages, names, opts.out.width))
    if collect:
        opts.out.print(f"[dim]{plural(len(acked), 'message')} marked as read[/]")
