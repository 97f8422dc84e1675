"""The provider registry: built-in providers plus third-party ones from entry points.

Third-party packages register a provider under the entry-point group
``substrat.providers``; the entry point names a zero-argument callable (or a
class) returning a :class:`~substrat.providers.base.Provider`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points

from substrat.errors import UnknownProviderError
from substrat.providers.base import Provider

ENTRY_POINT_GROUP = "substrat.providers"
ProviderFactory = Callable[[], Provider]


class ProviderRegistry:
    """Provider factories by name; a provider is built once, on first use."""

    def __init__(self) -> None:
        self._factories: dict[str, ProviderFactory] = {}
        self._built: dict[str, Provider] = {}
        self.load_errors: dict[str, str] = {}

    def register(self, name: str, factory: ProviderFactory | Provider) -> None:
        """Register ``factory`` (or a ready provider) under ``name``, replacing any."""
        if not isinstance(factory, type) and isinstance(factory, Provider):
            provider = factory
            self._factories[name] = lambda: provider
        else:
            self._factories[name] = factory
        self._built.pop(name, None)

    def get(self, name: str) -> Provider:
        if name not in self._factories:
            known = ", ".join(sorted(self._factories)) or "none"
            hint = (
                f" (failed to load: {self.load_errors[name]})" if name in self.load_errors else ""
            )
            raise UnknownProviderError(f"no provider named {name!r}{hint}; registered: {known}")
        if name not in self._built:
            self._built[name] = self._factories[name]()
        return self._built[name]

    def names(self) -> list[str]:
        return sorted(self._factories)

    def load_entry_points(self) -> None:
        """Register providers advertised by installed packages; a broken one is reported."""
        for ep in _advertised():
            try:
                self.register(ep.name, ep.load())
            except Exception as exc:  # a broken plugin must not stop the daemon
                self.load_errors[ep.name] = f"{type(exc).__name__}: {exc}"


@functools.cache
def _advertised() -> tuple[EntryPoint, ...]:
    """The installed ``substrat.providers`` entry points, read once per process.

    Reading them scans every installed distribution's metadata (about 10 ms here, more
    inside faultfs, which routes those reads), and the tests and fuzzers open an
    orchestrator on a default registry hundreds of times in one process. A daemon or a
    CLI command reads them once anyway; a package installed later is seen by the next
    process, as before.
    """
    return tuple(entry_points(group=ENTRY_POINT_GROUP))


BUILTIN = ("scripted", "fake", "openai", "claude-code")
DAEMON_ONLY = ("paced",)
"""Registered by the daemon itself (``substrat.daemon.build_registry``)."""


def provider_names() -> list[str]:
    """The names a daemon offers (built in, the daemon's own, installed plugins), unloaded."""
    plugins = [ep.name for ep in _advertised()]
    return sorted({*BUILTIN, *DAEMON_ONLY, *plugins})


def _openai() -> Provider:
    # Imported on first use: the openai SDK is an optional dependency.
    from substrat.providers.openai_chat import OpenAIProvider

    return OpenAIProvider()


def _claude_code() -> Provider:
    from substrat.providers.claude_code import ClaudeCodeProvider

    return ClaudeCodeProvider()


def default_registry() -> ProviderRegistry:
    """The built-in providers plus every installed ``substrat.providers`` entry point."""
    from substrat.providers.fake import FakeProvider
    from substrat.providers.scripted import ScriptedProvider

    registry = ProviderRegistry()
    registry.register("scripted", ScriptedProvider)
    registry.register("fake", FakeProvider)
    registry.register("openai", _openai)
    registry.register("claude-code", _claude_code)
    registry.load_entry_points()
    return registry
