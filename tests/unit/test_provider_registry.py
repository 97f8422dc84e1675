"""The provider registry: third-party providers from entry points, read once per process."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from substrat.errors import UnknownProviderError
from substrat.orchestrator import Orchestrator
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


def test_an_unknown_name_tells_an_application_how_to_register_one(fresh_scan: None) -> None:
    """A registry the library made serves an application, which has no daemon to restart
    (outside review s21f: it was told to run `substrat daemon restart`)."""
    reg = registry.ProviderRegistry()
    reg.register("scripted", ScriptedProvider)
    with pytest.raises(UnknownProviderError) as caught:
        reg.get("myhttp")
    said = str(caught.value)
    assert said.startswith("no provider named 'myhttp' (this process's providers are")
    assert "ProviderRegistry.register" in said and "registry=..." in said
    assert "daemon" not in said
    assert said.endswith("; registered: scripted")


def test_an_unknown_name_tells_a_daemon_client_to_restart_the_daemon(fresh_scan: None) -> None:
    from substrat.daemon import build_registry

    with pytest.raises(UnknownProviderError) as caught:
        build_registry().get("myhttp")
    assert str(caught.value).startswith(
        "no provider named 'myhttp' (providers are loaded when the daemon starts: one "
        "installed since needs `substrat daemon restart`); registered: "
    )


def test_a_library_root_refuses_an_unknown_provider_in_the_library_s_words(
    tmp_path: Path,
) -> None:
    """``paced`` is the daemon's demo provider: an application asking for it is told how
    to give the library a provider, and the root stays as it was (no agent made)."""

    async def scenario() -> None:
        async with Orchestrator.open(tmp_path / "root") as orch:
            with pytest.raises(UnknownProviderError, match="registry=") as caught:
                await orch.create_root("demo", "x", provider="paced")
            assert "daemon restart" not in str(caught.value)
            assert orch.agents() == []

    asyncio.run(scenario())
