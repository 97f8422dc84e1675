"""A third-party provider, loaded the way its installed package's entry point is.

Nothing is installed: each test writes a module and a ``*.dist-info`` (the
metadata ``pip install`` leaves) into a temporary directory, and the registry
reads the entry points of the distributions found there. The example is the
one docs/providers.md shows, read from the file, so the doc cannot drift.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Iterator
from importlib.metadata import EntryPoint, distributions
from pathlib import Path

import pytest

from substrat import events
from substrat.errors import ProviderRejectedError, UnknownProviderError
from substrat.eventlog import read_log
from substrat.orchestrator import Orchestrator
from substrat.providers import registry

DOCS = Path(__file__).resolve().parents[2] / "docs" / "providers.md"


def example_source() -> str:
    """The example provider module of docs/providers.md (its one ``echo_provider`` block)."""
    (block,) = re.findall(r"```python\n(\"\"\"echo_provider:.*?)```", DOCS.read_text(), re.S)
    return str(block)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory standing for site-packages; the registry sees only its entry points."""
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    before = set(sys.modules)

    def entry_points(group: str) -> list[EntryPoint]:
        found = distributions(path=[str(path)])
        return [ep for dist in found for ep in dist.entry_points if ep.group == group]

    monkeypatch.setattr(registry, "entry_points", entry_points)
    registry._advertised.cache_clear()
    yield path
    registry._advertised.cache_clear()  # the next user reads the real packages again
    for name in set(sys.modules) - before:
        del sys.modules[name]


def install(site: Path, package: str, module: str, source: str, entry: str) -> None:
    """What ``pip install`` of a one-module package with one provider entry point leaves."""
    (site / f"{module}.py").write_text(source)
    info = site / f"{package.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{entry}\n")


def restored_sources(orch: Orchestrator, agent: str) -> list[str]:
    path = orch.logs.path(orch.get(agent).session_id)
    entries = read_log(path).entries
    return [e["data"]["source"] for e in entries if e["event"] == events.SESSION_RESTORED]


def test_the_documented_example_provider_runs_turns(site: Path, root: Path) -> None:
    install(
        site,
        "echo-provider",
        "echo_provider",
        example_source(),
        "echo = echo_provider:EchoProvider",
    )

    async def go() -> None:
        orch = await Orchestrator.open(root, registry=registry.default_registry())
        with pytest.raises(ValueError, match="echo has no model 'gpt-4o'"):
            await orch.create_root("bad", provider="echo", model="gpt-4o")
        info = await orch.create_root("a", provider="echo")
        assert info.model == "echo-1"  # its default_model
        assert (await orch.run_turn("a", "hello")).response == "echo #1: hello"
        told = await orch.run_turn("a", "tell user: hi there")
        assert told.response == "echo #2: tell user: hi there"
        assert [m.payload for m in orch.user_inbox()] == ["hi there"]
        await orch.evict("a")  # suspended into its blob, restored from it
        assert (await orch.run_turn("a", "three")).response == "echo #3: three"
        with pytest.raises(ProviderRejectedError, match="retrying will not help"):
            await orch.run_turn("a", "@refuse this")
        assert (await orch.run_turn("a", "four")).response == "echo #4: four"
        assert restored_sources(orch, "a") == ["blob", "log"]
        await orch.close()
        # a new process: the conversation comes back from the log alone
        orch = await Orchestrator.open(root, registry=registry.default_registry())
        assert (await orch.run_turn("a", "five")).response == "echo #5: five"
        assert [t.prompt for t in orch.history("a")] == [
            "hello",
            "tell user: hi there",
            "three",
            "four",
            "five",
        ]
        assert len(orch.user_inbox()) == 1
        await orch.close()

    asyncio.run(go())


INCOMPLETE = """
class Empty:
    pass


class NoDefaultModel:
    name = "half"

    def models(self): return ["m"]
    async def create(self, model, system_prompt, context): ...
    async def restore(self, blob, history, *, model, system_prompt, context): ...


class SetInInit:
    name: str
    default_model: str

    def __init__(self):
        self.name, self.default_model = "late", "m"

    def models(self): return ["m"]
    async def create(self, model, system_prompt, context): ...
    async def restore(self, blob, history, *, model, system_prompt, context): ...


def factory():
    return Empty()
"""


def test_an_incomplete_provider_is_refused_at_load_naming_what_is_missing(site: Path) -> None:
    install(
        site,
        "my-provider",
        "my_provider",
        INCOMPLETE,
        "empty = my_provider:Empty\nhalf = my_provider:NoDefaultModel\n"
        "late = my_provider:SetInInit\nfactory = my_provider:factory",
    )
    reg = registry.default_registry()
    assert reg.load_errors["empty"] == (
        "entry point empty = my_provider:Empty (package my-provider 0.1) does not implement "
        "substrat's Provider: missing name, default_model, create(), restore(), models() "
        "(see docs/providers.md, Writing a provider)"
    )
    assert "empty" not in reg.names() and "half" not in reg.names()
    with pytest.raises(UnknownProviderError) as caught:
        reg.get("half")
    message = str(caught.value)
    assert "\n" not in message
    assert "half = my_provider:NoDefaultModel (package my-provider 0.1)" in message
    assert "missing default_model (" in message
    # an attribute the class declares and its __init__ sets is there once it is built
    assert reg.get("late").default_model == "m"
    # a factory function is judged by what it returns, on first use
    with pytest.raises(UnknownProviderError) as caught:
        reg.get("factory")
    assert str(caught.value) == (
        "provider 'factory': entry point factory = my_provider:factory (package my-provider "
        "0.1) returned a 'Empty' object, which does not implement substrat's Provider: missing "
        "name, default_model, create(), restore(), models() (see docs/providers.md, Writing a "
        "provider)"
    )
