"""The provider registry: built-in providers plus third-party ones from entry points.

Third-party packages register a provider under the entry-point group
``substrat.providers``; the entry point names a zero-argument callable (or a
class) returning a :class:`~substrat.providers.base.Provider`.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import PathFinder
from typing import TYPE_CHECKING

from substrat.errors import UnknownProviderError
from substrat.provider_names import BUILTIN, DAEMON_ONLY
from substrat.providers.base import Provider

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

ENTRY_POINT_GROUP = "substrat.providers"
ProviderFactory = Callable[[], Provider]


LIBRARY_HINT = (
    "this process's providers are the built-in ones, the entry points installed when it "
    "first loaded them, and those the application registered: register yours with "
    "ProviderRegistry.register and open the root with Orchestrator.open(root, "
    "registry=...) (docs/orchestrator.md, Providers in an application), or restart the "
    "program after installing one"
)
"""What an unknown name tells the caller of a registry the library made."""
DAEMON_HINT = (
    "providers are loaded when the daemon starts: one installed since needs "
    "`substrat daemon restart`"
)
"""What it tells a daemon's client (a registry with the daemon's own providers)."""


class ProviderRegistry:
    """Provider factories by name; a provider is built once, on first use.

    ``unknown_hint`` ends the error for a name nobody registered: what to do depends on
    who made the registry. None (the default): the daemon's words once a provider only
    the daemon registers is in it (its registry, and the CLI's check that mirrors it),
    else an application's."""

    def __init__(self, *, unknown_hint: str | None = None) -> None:
        self.unknown_hint = unknown_hint
        self._factories: dict[str, ProviderFactory] = {}
        self._built: dict[str, Provider] = {}
        self.load_errors: dict[str, str] = {}
        self._origins: dict[str, str] = {}  # name -> the entry point it came from, for errors

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
            if name in self.load_errors:
                hint = f" (failed to load: {self.load_errors[name]})"
            else:  # the usual causes: a plugin installed since, or not registered here
                hint = f" ({self._unknown_hint()})"
            raise UnknownProviderError(f"no provider named {name!r}{hint}; registered: {known}")
        if name not in self._built:
            built = self._factories[name]()
            missing = missing_members(built)
            if missing:  # a factory function's product is only seen here
                origin = self._origins.get(name)
                what = "it"
                if origin:
                    what = f"{origin} returned a {type(built).__name__!r} object, which"
                raise UnknownProviderError(
                    f"provider {name!r}: {what} does not implement substrat's Provider: "
                    f"missing {', '.join(missing)} (see docs/providers.md, Writing a provider)"
                )
            self._built[name] = built
        return self._built[name]

    def _unknown_hint(self) -> str:
        if self.unknown_hint is not None:
            return self.unknown_hint
        return DAEMON_HINT if any(n in self._factories for n in DAEMON_ONLY) else LIBRARY_HINT

    def names(self) -> list[str]:
        return sorted(self._factories)

    def load_entry_points(self) -> None:
        """Register providers advertised by installed packages; a broken one is reported."""
        for ep in _advertised():
            try:
                loaded = ep.load()
            except Exception as exc:  # a broken plugin must not stop the daemon
                self.load_errors[ep.name] = f"{type(exc).__name__}: {exc}"
                continue
            missing = missing_members(loaded)
            if missing:
                # refused now, in one line, rather than as an AttributeError deep in a turn
                self.load_errors[ep.name] = (
                    f"entry point {ep.name} = {ep.value}{_package(ep)} does not implement "
                    f"substrat's Provider: missing {', '.join(missing)} "
                    "(see docs/providers.md, Writing a provider)"
                )
                continue
            self.register(ep.name, loaded)
            self._origins[ep.name] = f"entry point {ep.name} = {ep.value}{_package(ep)}"


PROVIDER_ATTRIBUTES = ("name", "default_model")
PROVIDER_METHODS = ("create", "restore", "models")


def missing_members(obj: object) -> list[str]:
    """What ``obj`` (a provider class or instance) lacks of :class:`Provider`, in order.

    A class passes with an attribute it declares (a value, a property, or an
    annotation its ``__init__`` fills). A plain factory function cannot be judged
    before it is called: it passes here and its product is checked on first use.
    """
    if not isinstance(obj, type) and callable(obj) and not hasattr(obj, "create"):
        return []
    declared: set[str] = set()
    if isinstance(obj, type):
        for klass in obj.__mro__:
            declared.update(getattr(klass, "__annotations__", {}))
    missing = [a for a in PROVIDER_ATTRIBUTES if not hasattr(obj, a) and a not in declared]
    missing += [f"{m}()" for m in PROVIDER_METHODS if not callable(getattr(obj, m, None))]
    return missing


def _package(ep: EntryPoint) -> str:
    dist = ep.dist
    return f" (package {dist.name} {dist.version})" if dist is not None else ""


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


def entry_points(group: str) -> Sequence[EntryPoint]:
    """``importlib.metadata.entry_points(group=group)``, without importing
    importlib.metadata when no installed distribution can declare one of ``group``.

    That import (email, zipfile, csv and their kin) and the scan were about a sixth of
    a daemon start's CPU, paid by every start although, as a rule, no package installs a
    provider. The answer is the same: a distribution declares its entry points in its
    metadata directory's ``entry_points.txt``, under a ``[group]`` line, so a file that
    does not contain the group's name declares none of it.
    """
    if not _may_declare(group):
        return ()
    from importlib.metadata import entry_points as scan

    return scan(group=group)


def _may_declare(group: str) -> bool:
    """False only when no ``entry_points.txt`` importlib.metadata would read names ``group``.

    It reads what importlib.metadata's default finder reads: the ``*.dist-info`` and
    ``*.egg-info`` directories of each ``sys.path`` directory. Anything else it might
    read (a zip archive or an egg on sys.path, another finder of distributions on
    ``sys.meta_path``, a file it cannot read) answers True: importlib.metadata decides.
    """
    if any(
        getattr(finder, "find_distributions", None) is not None and finder is not PathFinder
        for finder in sys.meta_path
    ):
        return True
    needle = group.encode()
    for entry in sys.path:
        if not isinstance(entry, str):
            return True
        where = entry or "."
        try:
            names = os.listdir(where)
        except OSError:
            if not os.path.exists(where):
                continue  # importlib.metadata finds nothing there either
            return True  # a zip archive, or a directory it may not list
        if os.path.basename(where).lower().endswith(".egg"):
            return True
        for name in names:
            if not name.lower().endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(where, name, "entry_points.txt"), "rb") as file:
                    if needle in file.read():
                        return True
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError:
                return True
    return False


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
