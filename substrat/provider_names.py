"""The provider names every daemon offers, whatever is installed.

Apart from :mod:`substrat.providers.registry` because reading them there imports the
registry's entry-point machinery (``importlib.metadata``): ``agent create --provider
fake`` accepts a name listed here without scanning the installed packages (about a
sixth of that command's start-up); any other name, and the help, scan them
(:func:`substrat.providers.registry.provider_names`).
"""

from __future__ import annotations

BUILTIN = ("scripted", "fake", "openai", "claude-code")
DAEMON_ONLY = ("paced",)
"""Registered by the daemon itself (``substrat.daemon.build_registry``)."""
