"""A daemon started on demand never takes the agents' conversations to another endpoint.

Providers read the daemon's environment. After a crash, the next command starts
a daemon from its own shell; a shell that has only the generic ``OPENAI_*``
settings of other tools (which the docs suggest keeping apart from substrat's
``SUBSTRAT_OPENAI_*``) used to get a daemon that sent every agent's whole
conversation to that other endpoint, with that other key, without a word. The
on-demand start is refused now; an explicit ``daemon start`` switches.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.provider_env import fingerprint
from substrat.rpc import lock
from tests.support.chat_server import ChatServer
from tests.support.cli import cli_env, cli_root, kill_daemon, run


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def shell(root: Path, server: ChatServer, key: str, *, generic: bool) -> dict[str, str]:
    """A shell's environment: substrat's own settings, or only the generic ones."""
    env = cli_env(root)
    for name in ("SUBSTRAT_OPENAI_BASE_URL", "SUBSTRAT_OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(name, None)
    prefix = "" if generic else "SUBSTRAT_"
    env[f"{prefix}OPENAI_BASE_URL"] = server.base_url
    env[f"{prefix}OPENAI_API_KEY"] = key
    return env


def test_an_on_demand_start_with_other_provider_settings_is_refused(root: Path) -> None:
    with ChatServer() as mine, ChatServer() as other_tools:
        agents = shell(root, mine, "sk-substrat", generic=False)
        elsewhere = shell(root, other_tools, "sk-other-tools", generic=True)
        assert run(root, "daemon", "start", env=agents).returncode == 0
        create = ("agent", "create", "a", "--provider", "openai", "--model", "m")
        assert run(root, *create, env=agents).returncode == 0
        assert run(root, "agent", "send", "a", "private", env=agents).returncode == 0
        kill_daemon(root)

        refused = run(root, "agent", "send", "a", "next", env=elsewhere)
        assert refused.returncode == 3, refused.stderr
        assert "this shell's openai settings (endpoint " in refused.stderr
        assert f"{other_tools.base_url}, and its key) are not the last daemon's" in refused.stderr
        assert other_tools.requests == [] and not lock.is_held(root)

        # From the agents' own environment the on-demand start goes on as before.
        resumed = run(root, "agent", "send", "a", "next", env=agents)
        assert resumed.returncode == 0, resumed.stderr
        assert [r.authorization for r in mine.requests] == ["Bearer sk-substrat"] * 2

        # An explicit start is the user's decision: it switches.
        assert run(root, "daemon", "restart", env=elsewhere).returncode == 0
        assert run(root, "agent", "send", "a", "again", env=elsewhere).returncode == 0
        assert [r.authorization for r in other_tools.requests] == ["Bearer sk-other-tools"]
        first = mine.requests[0].messages
        assert other_tools.requests[0].messages[: len(first)] == first  # the same conversation


def test_a_shell_without_provider_settings_may_start_the_daemon(root: Path) -> None:
    with ChatServer() as mine:
        agents = shell(root, mine, "sk-substrat", generic=False)
        assert run(root, "daemon", "start", env=agents).returncode == 0
        kill_daemon(root)
        bare = cli_env(root)
        for name in (
            "SUBSTRAT_OPENAI_BASE_URL",
            "SUBSTRAT_OPENAI_API_KEY",
            "OPENAI_BASE_URL",
            "OPENAI_API_KEY",
        ):
            bare.pop(name, None)
        # no endpoint to send anything to: nothing can leak, the provider says what is missing
        assert run(root, "agent", "list", env=bare).returncode == 0
        info = lock.read_info(root)
        # the agents' endpoint is still the first one: a later on-demand start compares with it
        assert info is not None and info.provider_env == fingerprint(agents)
        assert "sk-substrat" not in (root / "daemon.lock").read_text()
