"""The providers a daemon offers: the default registry plus its own ``paced``.

Apart from :mod:`substrat.daemon` because ``agent create`` on a new root asks the
provider about its model as the daemon it starts would (substrat.cli.agent_cmds):
importing the daemon for that loaded its server, the orchestrator and asyncio, about
half of that command's CPU. ``paced`` (the demo's scripted provider with a pause per
turn) is built from :mod:`substrat.demo`, and so asyncio imported, only when used.
"""

from __future__ import annotations

from substrat.providers.base import Provider
from substrat.providers.registry import ProviderRegistry, default_registry


def build_registry() -> ProviderRegistry:
    """The default providers plus ``paced`` (scripted with a pause per turn, for demos)."""
    registry = default_registry()
    registry.register("paced", _paced)
    return registry


def _paced() -> Provider:
    from substrat.demo import PacedProvider

    return PacedProvider()
