"""The session's private bytecode cache for the processes its tests start (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import conftest
from tests.support import privileges


def fake_config(worker: bool = False) -> Any:
    config = SimpleNamespace(stash=pytest.Stash())
    if worker:
        config.workerinput = {}
    return config


def without_installed_links(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's cache without the installed bytecode linked in, for a test that does
    not look at the links: linking them (about 5,000) and removing them cost 1-2 CPU s a
    time. test_the_installed_bytecode_is_linked_in_and_read_from_there checks the links."""
    monkeypatch.setattr(conftest, "link_installed_bytecode", lambda prefix, **_: 0)


def test_with_bytecode_off_children_share_a_private_cache_removed_at_the_end(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    without_installed_links(monkeypatch)
    config = fake_config()
    conftest.pytest_configure(config)
    prefix = Path(os.environ["PYTHONPYCACHEPREFIX"])
    try:
        assert prefix.is_dir() and "PYTHONDONTWRITEBYTECODE" not in os.environ
        (tmp_path / "sample_module.py").write_text("VALUE = 7\n")
        subprocess.run(
            [sys.executable, "-c", "import sample_module"], cwd=tmp_path, check=True, env=os.environ
        )
        assert not (tmp_path / "__pycache__").exists()  # nothing beside the sources
        assert [p.name for p in prefix.rglob("sample_module*.pyc")]  # compiled once, kept
    finally:
        conftest.pytest_unconfigure(config)
    assert not prefix.exists()
    assert os.environ["PYTHONDONTWRITEBYTECODE"] == "1"
    assert "PYTHONPYCACHEPREFIX" not in os.environ


@pytest.mark.parametrize(
    ("environment", "worker"),
    [
        ({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/chosen"}, False),
        ({}, False),  # bytecode is written as usual: nothing to share
        ({"PYTHONDONTWRITEBYTECODE": "1"}, True),  # a worker inherits the controller's choice
    ],
)
def test_a_chosen_prefix_a_run_writing_bytecode_and_workers_are_left_alone(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], worker: bool
) -> None:
    for name in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    config = fake_config(worker)
    conftest.pytest_configure(config)
    conftest.pytest_unconfigure(config)
    seen = {
        n: os.environ[n]
        for n in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
        if n in os.environ
    }
    assert seen == environment


def session_cache(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str]:
    """The session's cache as the controller makes it (bytecode writing off): (config, prefix)."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    config = fake_config()
    conftest.pytest_configure(config)
    return config, os.environ["PYTHONPYCACHEPREFIX"]


def test_another_users_children_share_a_cache_of_their_own_removed_at_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The session's cache is private (mode 0700), so a child run as another user
    (tests/support/privileges.py) compiled everything from source at each start."""
    without_installed_links(monkeypatch)  # theirs has no links: it is a cache of its own
    config, prefix = session_cache(monkeypatch)
    try:
        how = privileges._other_user.__wrapped__(privileges.OTHER_UID)  # not the cached answer
        if isinstance(how, str):
            pytest.skip(how)
        argv, env = how
        theirs = Path(env["PYTHONPYCACHEPREFIX"])
        assert theirs == Path(f"{prefix}-uid{privileges.OTHER_UID}")
        assert theirs.stat().st_uid == privileges.OTHER_UID
        assert theirs.stat().st_mode & 0o777 == 0o700
        subprocess.run([*argv, "-c", "import substrat.errors"], env=env, cwd="/", check=True)
        assert [p.name for p in theirs.rglob("errors*.pyc")]  # compiled once, kept for the next
    finally:
        conftest.pytest_unconfigure(config)
    assert not Path(prefix).exists() and not theirs.exists()


def test_the_installed_bytecode_is_linked_in_and_read_from_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process with a prefix reads bytecode only there: without the links every worker
    and the first children compiled the standard library and the packages from source."""
    import json

    source = Path(json.__file__)
    installed = source.parent / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
    if not installed.exists():
        pytest.skip(f"this interpreter has no compiled standard library ({installed})")
    config, prefix = session_cache(monkeypatch)
    try:
        where = Path(prefix, source.parent.relative_to("/"), installed.name)
        assert where.is_symlink() and where.resolve() == installed.resolve()
        subprocess.run([sys.executable, "-c", "import json"], check=True, env=os.environ)
        assert where.is_symlink()  # valid, so read as it is: a compiled one would replace it
        stdlib = Path(prefix, source.parent.parent.relative_to("/"))
        assert not (stdlib / "test").exists()  # not the standard library's own tests
    finally:
        conftest.pytest_unconfigure(config)
    assert not Path(prefix).exists()  # the links go with the cache
    assert installed.exists()  # not what they pointed to


def test_only_the_wanted_top_level_modules_are_linked(tmp_path: Path) -> None:
    """An interpreter with a large site-packages (CI's image: 14,500 compiled files, most of
    packages no test imports) took 15,000 links; only the modules named are linked now."""
    entry = tmp_path / "site"
    tag = sys.implementation.cache_tag
    for where in ("wanted_pkg/__pycache__", "wanted_pkg/sub/__pycache__", "other_pkg/__pycache__"):
        (entry / where).mkdir(parents=True)
        (entry / where / f"__init__.{tag}.pyc").write_bytes(b"")
    (entry / "__pycache__").mkdir()
    for module in ("wanted_mod", "other_mod"):
        (entry / "__pycache__" / f"{module}.{tag}.pyc").write_bytes(b"")
    prefix = tmp_path / "prefix"
    linked = conftest.link_installed_bytecode(
        str(prefix), entries=[str(entry)], wanted=frozenset({"wanted_pkg", "wanted_mod"})
    )
    mirror = prefix / entry.relative_to("/")
    found = sorted(str(p.relative_to(mirror)) for p in mirror.rglob("*.pyc"))
    assert found == [  # where the prefix maps each source: no __pycache__ there
        f"wanted_mod.{tag}.pyc",
        f"wanted_pkg/__init__.{tag}.pyc",
        f"wanted_pkg/sub/__init__.{tag}.pyc",
    ]
    assert linked == 3
    everything = conftest.link_installed_bytecode(str(tmp_path / "all"), entries=[str(entry)])
    assert everything == 5  # no names: all of it, as before


IMPORTS_OF_A_TEST_PROCESS = """
import sys
from tests.support.linked_bytecode import wanted_top_levels
wanted = wanted_top_levels()
import substrat.cli, substrat.daemon, substrat.providers.openai_chat
import hypothesis, pyfakefs, pytest, xdist, faultfs, oracle
print("\\n".join(sorted({name.partition(".")[0] for name in sys.modules} - wanted)))
"""


def test_the_wanted_modules_cover_what_the_cli_daemons_and_workers_import() -> None:
    """Left out, a module is compiled again by the first process that imports it: the set
    must hold what a CLI command, a daemon with the OpenAI provider and a worker import
    (the checkout's own modules aside: they are never linked), from a bare interpreter."""
    if conftest.linked_bytecode.wanted_top_levels() is None:
        pytest.skip("substrat is not installed: everything is linked")
    checkout = Path(conftest.__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", IMPORTS_OF_A_TEST_PROCESS],
        cwd=checkout,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    missing = set(out.split())
    assert missing <= {"substrat", "faultfs", "oracle", "tests"}, missing
