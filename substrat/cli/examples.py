"""An example (or a few) at the end of every ``--help`` page.

Kept in one place so that none is forgotten: :func:`add_examples` puts them
in each command's epilog (Click's ``\\b`` keeps the lines as written) when its
module is loaded (substrat.cli.COMMANDS), and the tests check that every command
has some.
"""

from __future__ import annotations

import click

EXAMPLES: dict[str, list[str]] = {
    "": [
        "substrat agent create lead -i 'You coordinate the crew.'",
        "substrat --root /tmp/play agent list --all",
        "substrat chat lead",
    ],
    "daemon": ["substrat daemon start", "substrat daemon status", "substrat daemon logs -f"],
    "daemon start": ["substrat daemon start", "substrat daemon start --foreground"],
    "daemon stop": ["substrat daemon stop"],
    "daemon restart": [
        "export SUBSTRAT_OPENAI_API_KEY=sk-...   # providers read the daemon's environment",
        "substrat daemon restart",
    ],
    "daemon status": ["substrat daemon status", 'kill -9 "$(substrat daemon status --pid)"'],
    "daemon logs": ["substrat daemon logs -n 100", "substrat daemon logs -f"],
    "agent": ["substrat agent create lead", "substrat agent list --all"],
    "agent create": [
        "substrat agent create lead -i 'You coordinate the crew.'",
        "substrat agent create bot --provider openai --model llama3.1",
        "substrat agent create slowpoke --provider paced --model 3000ms",
    ],
    "agent send": [
        'substrat agent send lead "Who is on the crew?"',
        'echo "Summarise the log." | substrat agent send lead -',
        'substrat agent send --wait lead/scout "Report back."',
    ],
    "agent list": [
        "substrat agent list",
        "substrat agent list --all --json",
        'substrat log "$(substrat agent list -q | head -n 1)"',
    ],
    "agent tree": ["substrat agent tree"],
    "agent show": ["substrat agent show lead/scout", "substrat agent show 83b6ab9d"],
    "agent rm": ["substrat agent rm lead/scout", "substrat agent rm lead --cascade"],
    "inbox": ["substrat inbox", "substrat inbox --collect --json"],
    "chat": ["substrat chat lead", "printf 'hello\\nhow are you?\\n' | substrat chat lead"],
    "log": ["substrat log lead", "substrat log lead/scout -n 5 --follow"],
    "watch": [
        "substrat watch",
        "substrat watch -e turn.tool -e turn.completed --json",
        "substrat watch --follow-restarts",
    ],
    "fsck": ["substrat fsck", "substrat fsck --repair", "substrat fsck --acknowledge 1"],
    "recover": ["substrat recover --dry-run", "substrat recover"],
    "compact": [
        "substrat compact --dry-run",
        "substrat compact --segment-bytes 1048576",
        "substrat compact --policy delete --dry-run",
    ],
    "demo": ["substrat demo", "substrat demo --root /tmp/crash-demo"],
}


def _walk(command: click.Command, path: str) -> list[tuple[str, click.Command]]:
    found = [(path, command)]
    if isinstance(command, click.Group):
        # through get_command: the ``substrat`` group loads its commands when asked for
        ctx = click.Context(command, info_name=path or "substrat")
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, name
            found += _walk(sub, f"{path} {name}".strip())
    return found


def add_examples(command: click.Command, path: str, *, walk: bool = True) -> None:
    """Put the examples of ``command`` (``path`` names it: ``"agent"``, ``""`` for
    ``substrat``) into its epilog, and with ``walk`` those of every command under it;
    every command must have some."""
    for where, each in _walk(command, path) if walk else [(path, command)]:
        lines = EXAMPLES.get(where)
        assert lines, f"no examples for `substrat {where}`"
        body = "\n".join(f"  {line}" for line in lines)
        each.epilog = f"\b\nExamples:\n{body}"


def commands(main: click.Group) -> list[tuple[str, click.Command]]:
    """Every command under ``main`` with its path (``"agent send"``), ``main`` first."""
    return _walk(main, "")
