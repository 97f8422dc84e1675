"""``substrat chat AGENT``: a conversation in the terminal, one turn per line.

Each line is sent as a turn. The answer streams as it comes (a spinner says
what the turn is doing until then), and a line on stderr says when the turn
is committed. If the daemon dies mid-turn, the text that streamed is marked
not committed; chat starts the daemon again (unless --no-autostart, then it
waits for one), and once recovery has run it says what became of the cut
turn: lost (the agent is told at its next turn) or, if the daemon committed
it just before dying, committed after all. Then the conversation goes on.

Ctrl-C during a turn stops waiting for it (the daemon still finishes and
commits it); Ctrl-D or ``/quit`` ends the chat. Off a terminal, lines are
read from stdin as they come, so chat can be scripted; ``--json`` prints one
JSON object per event instead of text.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from substrat import client as client_mod
from substrat.cli.agent_cmds import SEND_TIMEOUT_S
from substrat.cli.common import Opts, daemon_command, emit_json, esc, lazy_module
from substrat.cli.events_cmds import RECONNECT_MAX_S
from substrat.cli.explain import reword
from substrat.cli.turns import TurnView, check_prompt
from substrat.errors import (
    AgentError,
    BadInputError,
    DaemonError,
    DaemonNotRunningError,
    RequestTimeoutError,
    RpcError,
)
from substrat.rpc import protocol
from substrat.words import plural

if TYPE_CHECKING:
    from substrat.cli import lines
else:
    lines = lazy_module("substrat.cli.lines")  # loaded when a line says something

HELP = """\
/help        this list
/show        the agent: state, turns, a turn lost in a crash
/log [N]     the last N committed turns (default 3)
/quit        end the chat (so does Ctrl-D)
A line ending in \\ continues on the next line."""


@click.command("chat")
@daemon_command(SEND_TIMEOUT_S)
@click.argument("agent")
@click.option("--wait", is_flag=True, help="If AGENT is running a turn, wait for it to finish.")
def chat(opts: Opts, agent: str, wait: bool) -> None:
    """Talk with AGENT: each line is a turn; answers stream, commits are confirmed.

    If the daemon dies mid-turn, chat says the streamed text was not
    committed, starts the daemon again (unless --no-autostart), reports
    whether the turn was lost, and carries on. /help lists the commands;
    Ctrl-D or /quit ends the chat.
    """
    ChatSession(opts, agent, wait).run()


class ChatSession:
    """One chat: a connection that is remade when the daemon goes away."""

    def __init__(self, opts: Opts, agent: str, wait: bool) -> None:
        self.opts = opts
        self.ref = agent
        self.wait = wait
        self.agent_id = ""
        self.path = agent
        self.conn: client_mod.Client | None = None
        self.cut_turn: str | None = None
        """A turn cut by the daemon's death, to be resolved once it is back."""
        self.interactive = sys.stdin.isatty()

    # -- output --------------------------------------------------------------------

    def say(self, markup: str, **event: Any) -> None:
        """A line for people (stderr), or the same as a JSON object with --json."""
        if self.opts.json:
            if event:
                emit_json(event)
        else:
            self.opts.err.print(markup)

    # -- the connection ------------------------------------------------------------

    def connect(self, *, reconnecting: bool) -> None:
        delay = 0.1
        while True:
            try:
                self.conn = self.opts.connect()
                break
            except DaemonNotRunningError:  # --no-autostart: wait for someone to start one
                if not reconnecting:
                    raise
                time.sleep(delay)
                delay = min(RECONNECT_MAX_S, delay * 2)
        info = self.conn.call("agent.show", {"agent": self.agent_id or self.ref})
        agent = info["agent"]
        if agent["state"] == "terminated":
            raise AgentError(f"agent {agent['path']} was terminated; there is no one to chat with")
        self.agent_id, self.path = agent["agent_id"], agent["path"]
        if reconnecting:
            pid = self.conn.call("ping")["pid"]
            self.say(
                f"[green]reconnected[/] to the daemon (pid {pid})", event="reconnected", pid=pid
            )
        if self.cut_turn is not None:
            self._resolve_cut(info)
        elif info.get("lost_turn"):
            self._tell_lost(info["lost_turn"])
        if not reconnecting:
            self.say(
                f"[bold]{esc(self.path)}[/] [dim]({esc(agent['provider'])}/"
                f"{esc(agent['model'])}, {plural(info['turns'], 'turn')})[/] · /help · Ctrl-D ends",
                event="chat",
                agent=agent,
            )

    def _resolve_cut(self, info: dict[str, Any]) -> None:
        turn_id, self.cut_turn = self.cut_turn, None
        assert self.conn is not None
        history = self.conn.call("agent.history", {"agent": self.agent_id, "limit": 10})
        if any(t["turn_id"] == turn_id for t in history["turns"]):
            self.say(
                f"[green]turn {esc(turn_id)} was committed after all[/] (just before the "
                "daemon died); it is in the conversation",
                event="turn.committed_after_all",
                turn_id=turn_id,
            )
            return
        lost = info.get("lost_turn")
        if lost is not None:
            self._tell_lost(lost)
        else:  # a clean stop cancels a running turn: failed, not lost in a crash
            self.say(
                f"[red]turn {esc(turn_id)} was not committed[/] (the daemon stopped first)",
                event="turn.lost",
                turn_id=turn_id,
            )

    def _tell_lost(self, lost: dict[str, Any]) -> None:
        prompt = lines.lost_prompt(lost, 50)
        self.say(
            f"[red]turn {esc(lost.get('turn_id'))} was lost in the crash[/] "
            f"[dim](prompt: {esc(prompt)})[/]; {esc(self.path)} is told at its next turn",
            event="turn.lost",
            **lost,
        )

    def drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> None:
        self.connect(reconnecting=False)
        try:
            while True:
                line = self.read()
                if line is None:
                    return
                if line.startswith("/"):
                    if not self.command(line):
                        return
                    continue
                try:
                    check_prompt(line)
                    self.turn(line)
                except BadInputError as exc:  # refused before it was sent: the chat goes on
                    if line.strip():  # a blank line is just skipped
                        self.say(f"[red]{esc(exc)}[/]", event="error", message=str(exc))
        finally:
            self.drop()

    def read(self) -> str | None:
        """The next prompt (continued over lines ending in a backslash); None at the end."""
        parts: list[str] = []
        while True:
            try:
                if self.interactive and not self.opts.json:
                    line = input(f"{self.path}> " if not parts else "... ")
                else:
                    raw = sys.stdin.readline()
                    if not raw:
                        raise EOFError
                    line = raw.rstrip("\n")
            except EOFError:
                if self.interactive:
                    click.echo(err=True)
                return "\n".join(parts) if parts else None
            except KeyboardInterrupt:  # at the prompt: drop the line, as shells do
                click.echo(err=True)
                parts = []
                continue
            if line.endswith("\\"):
                parts.append(line[:-1])
                continue
            parts.append(line)
            return "\n".join(parts)

    def command(self, line: str) -> bool:
        """Run a /command; False ends the chat."""
        word, _, rest = line.partition(" ")
        assert self.conn is not None
        if word in ("/quit", "/exit"):
            return False
        if word == "/help":
            self.say(esc(HELP), event="help", text=HELP)
        elif word == "/show":
            info = self.conn.call("agent.show", {"agent": self.agent_id})
            if self.opts.json:
                emit_json({"event": "show", **info})
            else:
                a = info["agent"]
                self.say(
                    f"[bold]{esc(a['path'])}[/] {esc(a['state'])}, {plural(info['turns'], 'turn')}"
                )
                if info.get("lost_turn"):
                    self._tell_lost(info["lost_turn"])
        elif word == "/log":
            count = int(rest) if rest.strip().isdigit() else 3
            history = self.conn.call("agent.history", {"agent": self.agent_id, "limit": count})
            first = history["total"] - len(history["turns"]) + 1
            for offset, turn in enumerate(history["turns"]):
                if self.opts.json:
                    emit_json({"event": "log", "number": first + offset, **turn})
                else:
                    lines.print_turn(self.opts.out, turn, first + offset)
        else:
            self.say(f"[red]unknown command {esc(word)}[/]; /help lists them", event="error")
        return True

    def turn(self, prompt: str) -> None:
        opts = self.opts
        stream = not opts.json
        if self.conn is None:
            self.connect(reconnecting=True)
        assert self.conn is not None
        params = {
            "agent": self.agent_id,
            "prompt": prompt,
            "stream": stream,
            "progress": stream,
            "wait": self.wait,
        }
        view = TurnView(opts.out, opts.err, self.path)
        try:
            with view:
                result = self.conn.call(
                    "agent.send",
                    params,
                    on_notification=view.on_notification if stream else None,
                    on_silence=opts.frozen_check(),
                )
                if opts.json:
                    emit_json({"event": "turn", **result})
                else:
                    view.committed(result)
        except RpcError as exc:
            self._refused(view, exc)
        except RequestTimeoutError as exc:  # silent, not dead: the turn may still run
            self.drop()
            self.say(
                f"[yellow]{esc(exc)}[/]; the turn may still be running (/log shows it once "
                "committed)",
                event="timeout",
                message=str(exc),
            )
        except DaemonError as exc:  # the daemon went away mid-turn
            if not opts.json:
                view.not_committed(exc)
            cause = str(exc).split(";")[0]
            self.say(f"[red]{esc(cause)}[/]", event="not_committed", turn_id=view.turn_id)
            self.cut_turn = view.turn_id
            self.drop()
            self.say("[dim]reconnecting (the daemon recovers the root first)...[/]")
            self.connect(reconnecting=True)
        except KeyboardInterrupt:
            if not opts.json:
                view.detached()
            self.drop()  # the answer would otherwise come back on this connection later
            with contextlib.suppress(DaemonError):
                self.connect(reconnecting=True)

    def _refused(self, view: TurnView, exc: RpcError) -> None:
        if not self.opts.json:
            view.not_committed(exc)
        better = reword(exc, "send")
        self.say(
            f"[bold red]error:[/] {esc(better.message)}",
            event="error",
            code=exc.code,
            message=better.message,
        )
        if exc.code == protocol.AGENT_REFUSED:  # terminated meanwhile: nothing left to do
            raise SystemExit(1)
