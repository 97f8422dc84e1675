"""The provider registry: third-party providers from entry points, read once per process."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import EntryPoint

import pytest

from substrat.errors import UnknownProviderError
from substrat.providers import registry
from substrat.providers.scripted import ScriptedProvider


@pytest.fixture
def fresh_scan() -> Iterator[None]:
    registry._advertised.cache_clear()
    yield
    registry._advertised.cache_clear()  # the next user reads the real packages again


def test_entry_points_are_read_once_and_every_registry_gets_them(
    monkeypatch: pytest.MonkeyPatch, fresh_scan: None
) -> None:
    scans: list[str] = []
    plugin = EntryPoint(
        "echo", "substrat.providers.scripted:ScriptedProvider", registry.ENTRY_POINT_GROUP
    )
    broken = EntryPoint("broken", "no_such_module_here:Provider", registry.ENTRY_POINT_GROUP)

    def entry_points(group: str) -> list[EntryPoint]:
        scans.append(group)
        return [plugin, broken]

    monkeypatch.setattr(registry, "entry_points", entry_points)
    first, second = registry.default_registry(), registry.default_registry()
    assert scans == [registry.ENTRY_POINT_GROUP]  # the metadata scan, once
    for built in (first, second):
        assert isinstance(built.get("echo"), ScriptedProvider)
        assert "ModuleNotFoundError" in built.load_errors["broken"]
    assert first.get("echo") is not second.get("echo")  # each registry builds its own
    assert "echo" in registry.provider_names() and scans == [registry.ENTRY_POINT_GROUP]


def test_an_unknown_name_says_providers_are_loaded_at_start(fresh_scan: None) -> None:
    reg = registry.ProviderRegistry()
    reg.register("scripted", ScriptedProvider)
    with pytest.raises(UnknownProviderError) as caught:
        reg.get("myhttp")
    assert str(caught.value) == (
        "no provider named 'myhttp' (providers are loaded when the daemon starts: one "
        "installed since needs `substrat daemon restart`); registered: scripted"
    )
