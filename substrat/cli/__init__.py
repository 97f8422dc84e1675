"""The ``substrat`` command line."""

from __future__ import annotations

import click

from substrat import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="substrat")
def main() -> None:
    """Substrat: a crash-safe orchestrator for trees of LLM agents."""
