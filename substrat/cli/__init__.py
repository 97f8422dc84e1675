"""The ``substrat`` command line (click; rich for people, ``--json`` for scripts).

Every command takes ``--root`` (default ``$SUBSTRAT_HOME`` or ``~/.substrat``)
and ``--json``. Commands that talk to the daemon start it when none runs
(``--no-autostart`` or ``SUBSTRAT_NO_AUTOSTART=1`` turns that off) and give up
after ``--timeout`` seconds of silence. Exit codes are listed in
:mod:`substrat.cli.common`.
"""

from __future__ import annotations

import importlib
import io
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from substrat import __version__
from substrat.cli.common import group_options, leave_quietly, stdout_closed
from substrat.cli.examples import add_examples

COMMANDS = {
    "daemon": ("daemon_cmds", "daemon_group"),
    "agent": ("agent_cmds", "agent_group"),
    "inbox": ("agent_cmds", "inbox"),
    "chat": ("chat", "chat"),
    "log": ("events_cmds", "log"),
    "watch": ("events_cmds", "watch"),
    "fsck": ("offline_cmds", "fsck"),
    "recover": ("offline_cmds", "recover"),
    "compact": ("compact_cmds", "compact"),
    "demo": ("offline_cmds", "demo"),
}
"""Each command's module under ``substrat.cli`` and its name there, imported when the
command is asked for: a process runs one command, and loading the others' modules (with
what they import, and click's objects for their options) was about a tenth of its start."""


class _Main(click.Group):
    """The ``substrat`` group: usage errors come as JSON too when ``--json`` was given.

    click reports a bad option or argument before any command runs, as plain
    text; a script that asked for ``--json`` reads ``{"error": ...}`` on stderr
    for every failure, this one included.

    Its commands are loaded when asked for (:data:`COMMANDS`); an unknown name loads
    them all, so that click's "did you mean" sees every one.
    """

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            for name in [cmd_name] if cmd_name in COMMANDS else [*COMMANDS]:
                self._load(name)
        return self.commands.get(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def _load(self, name: str) -> None:
        if name in self.commands:
            return
        module, attribute = COMMANDS[name]
        command = getattr(importlib.import_module(f"substrat.cli.{module}"), attribute)
        assert isinstance(command, click.Command) and command.name == name, name
        add_examples(command, name)
        self.add_command(command)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            result = self._main(*args, **kwargs)
        except SystemExit:
            _flush_stdout()
            raise
        _flush_stdout()
        return result

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # not one click words as exit 1: a closed output is no failure of ours
            if stdout_closed():
                leave_quietly()
            raise

    def _main(self, *args: Any, **kwargs: Any) -> Any:
        argv = list(kwargs.get("args") or (args[0] if args else None) or sys.argv[1:])
        if "--json" not in argv[: argv.index("--") if "--" in argv else len(argv)]:
            return super().main(*args, **kwargs)
        try:
            return super().main(*args, **{**kwargs, "standalone_mode": False})
        except click.ClickException as exc:
            body = {"type": type(exc).__name__, "message": exc.format_message()}
            click.echo(json.dumps({"error": body}), err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo(json.dumps({"error": {"type": "Abort", "message": "aborted"}}), err=True)
            sys.exit(1)


def _flush_stdout() -> None:
    """The output's reader may be gone only at the last flush (`| head -1`): exit quietly
    then (common.leave_quietly), not with a traceback at the interpreter's exit."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        leave_quietly()
    except (OSError, ValueError, AttributeError):
        pass


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="substrat")
@group_options
def main(group_root: Path | None, group_json: bool) -> None:
    """Substrat: a crash-safe orchestrator for trees of LLM agents.

    Every command takes --root DIR and --json (for scripts) anywhere before or
    after its name (`substrat --json agent list`, `substrat agent list --json`),
    and -h for its help with examples.
    """
    # Input that is not UTF-8 reaches the one check every request passes
    # (protocol.check_text: one line, rc 2) whatever the locale says stdin is.
    if isinstance(sys.stdin, io.TextIOWrapper) and sys.stdin.errors != "surrogateescape":
        sys.stdin.reconfigure(errors="surrogateescape")


add_examples(main, "", walk=False)


def run() -> NoReturn:
    """The ``substrat`` program (its console script): :func:`main`, then the process's
    end without the interpreter's teardown (substrat.process_end; its CPU is in
    docs/benchmarks.md). A command has written what it owes the user when ``main`` ends:
    its output flushed by ``main``, a root's files fsynced by the code that wrote them."""
    from substrat.process_end import leave

    try:
        main()
    except SystemExit as exc:
        code = exc.code
    else:  # (click's standalone main always exits)
        code = 0
    if not isinstance(code, int):
        raise SystemExit(code)  # a message or None: the interpreter says and maps it
    leave(code)


__all__ = ["main", "run"]
