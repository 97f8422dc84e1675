"""One turn as the terminal shows it: progress, the streamed text, and whether it counts.

Streaming and durability are two different moments. The text is printed as
the provider streams it; the turn is *committed* only when its
``turn.complete`` entry is fsynced, which the daemon's answer confirms. So
after the text comes one line on stderr: ``✓ turn t3 committed``, or, when
the provider failed first, ``✗ not committed``: what was shown is not part of
the conversation; when the daemon died before confirming, ``? outcome unknown``
(almost always lost: after a restart the turn is reported lost and the agent is
told at its next turn; ``substrat log`` shows it if it committed just before).

Before the first token a spinner (Rich's status, on a terminal only) says
what the turn is doing: waiting for a busy agent, thinking, retrying the
endpoint (with the attempt count), running a tool. Off a terminal, retries
are still reported, one plain line each.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any

import click

from substrat.cli.common import esc, for_terminal, group_json, group_root
from substrat.errors import RpcError
from substrat.prompts import MAX_PROMPT_CHARS, check_prompt
from substrat.rpc.protocol import OUTCOME_UNKNOWN
from substrat.words import plural

if TYPE_CHECKING:
    from rich.status import Status

    from substrat.cli.output import Output


class PromptCommand(click.Command):
    """A command with a PROMPT argument, which may be text that starts with '-'.

    Click takes such text for an option ("No such option '--help me'"). When
    the command line parses with that text after '--', the error says so and
    gives the line to type; a mistyped option keeps click's own error.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, list(args))
        except click.NoSuchOption as exc:
            line = self._with_prompt_after_dashes(ctx, args, exc.option_name)
            if line is None:
                raise
            raise click.NoSuchOption(
                exc.option_name,
                message=f"A prompt starting with '-' goes after '--': {' '.join(line)}",
                ctx=ctx,
            ) from None

    def _with_prompt_after_dashes(
        self, ctx: click.Context, args: list[str], option_name: str
    ) -> list[str] | None:
        """The command line with the unknown "option" moved after '--', if that parses."""
        if "--" in args:
            return None
        # "-x me" is reported as '-x' (short options are read one letter at a time)
        token = next((a for a in args if a.startswith(option_name)), None)
        if token is None:
            return None
        moved = [a for a in args if a is not token] + ["--", token]
        try:
            super().parse_args(click.Context(self, ctx.parent, ctx.info_name), list(moved))
        except click.UsageError:
            return None
        # what was given before the command's name goes with it, as the command takes it too
        given = ["--root", str(group_root())] if group_root() and "--root" not in args else []
        given += ["--json"] if group_json() and "--json" not in args else []
        import shlex  # (only for this advice: not part of every command's start)

        return [ctx.command_path, *map(shlex.quote, given + moved)]


def read_prompt(prompt: str) -> str:
    """The prompt (``-`` reads stdin), refused if blank or over the daemon's limit.

    Standard input is read only up to one character past the limit, so a
    50 MB file is refused at once instead of being read and sent.
    """
    source = "the prompt"
    if prompt == "-":
        prompt = sys.stdin.read(MAX_PROMPT_CHARS + 1)
        source = "standard input"
    check_prompt(prompt, source)
    return prompt


def describe_status(agent: str, params: dict[str, Any]) -> str:
    """What a ``turn.status`` notification means, in a few words (markup)."""
    status = params.get("status")
    if status == "waiting":
        return f"{esc(agent)} is running another turn; waiting for it (--wait)"
    if status == "queued":
        return (
            f"the daemon runs {params.get('limit')} turns at once, its limit; waiting for one "
            "to finish (--wait)"
        )
    if status == "retrying":
        return (
            f"retrying ({params.get('attempt')}/{params.get('max_retries')}) in "
            f"{float(params.get('delay_s') or 0):.1f}s: {esc(params.get('error', ''))}"
        )
    if status == "tool":
        return f"{esc(agent)} ran {esc(params.get('tool'))}"
    return f"{esc(agent)} is thinking"


class TurnView:
    """Shows one turn (see the module docstring). Use as a context manager."""

    def __init__(self, out: Output, err: Output, agent: str) -> None:
        self.out = out
        self.err = err
        self.agent = agent
        self.text_shown = False
        self.turn_id: str | None = None
        """Set once the daemon said the turn started (it has an id and a log entry)."""
        self._at_line_start = True
        self._status: Status | None = None
        self._spinning = err.is_terminal

    def __enter__(self) -> TurnView:
        if self._spinning:
            self._status = self.err.status(f"{esc(self.agent)}: sending", spinner="dots")
            self._status.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop_spinner()

    def _stop_spinner(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _end_line(self) -> None:
        if not self._at_line_start:
            click.echo()
            self._at_line_start = True

    def on_notification(self, method: str, params: dict[str, Any]) -> None:
        if method == "turn.chunk":
            text = str(params.get("text", ""))
            if not text:
                return
            self._stop_spinner()
            click.echo(for_terminal(text), nl=False)  # (none if stdout was closed: `>&-`)
            if sys.stdout is not None:
                sys.stdout.flush()
            self.text_shown = True
            self._at_line_start = text.endswith("\n")
        elif method == "turn.status":
            if params.get("turn_id"):
                self.turn_id = str(params["turn_id"])
            line = describe_status(self.agent, params)
            if self._status is not None:
                self._status.update(line)
            elif params.get("status") == "retrying":  # worth a line even without a spinner
                if self.out.is_terminal:
                    self._end_line()
                self.err.print(f"[yellow]↻ {line}[/]")

    def committed(self, result: dict[str, Any]) -> None:
        """The daemon's answer came: the turn is durable."""
        self._stop_spinner()
        self._end_line()
        extras = []
        spawned = [s.get("name") for s in (result.get("effects") or {}).get("spawns", [])]
        if spawned:
            extras.append(f"spawned {', '.join(str(s) for s in spawned)}")
        if result.get("messages_sent"):
            extras.append(f"sent {plural(len(result['messages_sent']), 'message')}")
        tail = "".join(f" · {esc(e)}" for e in extras)
        self.err.print(f"[green]✓[/] [dim]turn {esc(result['turn_id'])} committed{tail}[/]")

    def detached(self) -> None:
        """The user interrupted the client; the daemon finishes (and commits) the turn."""
        self._stop_spinner()
        self._end_line()
        self.err.print(
            f"[yellow]interrupted:[/] the turn goes on in the daemon and is committed there; "
            f"`substrat log {esc(self.agent)}` shows it"
        )

    def not_committed(self, exc: BaseException) -> None:
        """The turn failed or was cut: say that what was shown does not count.

        A refusal before the turn started (unknown agent, busy) needs no such line.
        """
        self._stop_spinner()
        self._end_line()
        if not (self.text_shown or self.turn_id):
            return
        what = "the text above is not" if self.text_shown else "none of it is"
        if isinstance(exc, RpcError) and exc.code == OUTCOME_UNKNOWN:
            data = exc.data if isinstance(exc.data, dict) else {}
            if data.get("committed"):  # it happened; a step after its commit point failed
                self.err.print(
                    f"[yellow]✓ committed, not fully applied:[/] {esc(self.agent)}'s turn is "
                    "part of its conversation (do not send it again); see the error below"
                )
            else:
                self.err.print(
                    f"[yellow]? undecided:[/] whether this turn is part of {esc(self.agent)}'s "
                    "conversation is unknown until a restart settles it (`substrat log` then tells)"
                )
            return
        if isinstance(exc, RpcError):  # the daemon answered: the turn failed, for sure
            self.err.print(
                f"[bold red]✗ not committed:[/] {what} part of {esc(self.agent)}'s conversation"
            )
            return
        turn = f"turn {self.turn_id}" if self.turn_id else "the turn"
        # The daemon died: almost always mid-turn, but it may have committed just before,
        # so the headline claims neither.
        self.err.print(
            f"[bold yellow]? outcome unknown:[/] the daemon died before confirming {esc(turn)}; "
            f"{what} part of {esc(self.agent)}'s conversation unless `substrat log "
            f"{esc(self.agent)}` shows {esc(turn)} after the restart"
        )
