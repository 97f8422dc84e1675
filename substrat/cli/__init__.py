"""The ``substrat`` command line (click; rich for people, ``--json`` for scripts).

Every command takes ``--root`` (default ``$SUBSTRAT_HOME`` or ``~/.substrat``)
and ``--json``. Commands that talk to the daemon start it when none runs
(``--no-autostart`` or ``SUBSTRAT_NO_AUTOSTART=1`` turns that off) and give up
after ``--timeout`` seconds of silence. Exit codes are listed in
:mod:`substrat.cli.common`.
"""

from __future__ import annotations

import click

from substrat import __version__
from substrat.cli.agent_cmds import agent_group, inbox
from substrat.cli.daemon_cmds import daemon_group
from substrat.cli.events_cmds import log, watch
from substrat.cli.offline_cmds import demo, fsck, recover


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="substrat")
def main() -> None:
    """Substrat: a crash-safe orchestrator for trees of LLM agents."""


for command in (daemon_group, agent_group, inbox, log, watch, fsck, recover, demo):
    main.add_command(command)

__all__ = ["main"]
