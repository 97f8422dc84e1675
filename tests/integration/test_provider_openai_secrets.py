"""Credentials in the endpoint's URL stay out of everything substrat writes or shows.

A proxy in front of a model server often takes basic auth in the URL
(``http://user:password@host/v1``) or a key in its query. The daemon runs as a
real process against the loopback server; its turns fail and are retried, and
then no file of the root (event logs, daemon.log, the user's inbox) and no
error a client is given holds the password.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from substrat.client import Client, DaemonProcess, RpcError
from substrat.daemon_logging import redact
from substrat.providers.openai_config import endpoint_label
from tests.support.chat_server import ChatServer, error

PASSWORD = "PW-sekret-0d1e"
START_TIMEOUT_S = 30.0


def with_credentials(base_url: str) -> str:
    scheme, _, rest = base_url.partition("://")
    return f"{scheme}://proxyuser:{PASSWORD}@{rest}"


def files_holding(root: Path, needle: str) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and needle.encode() in path.read_bytes():
            found.append(str(path.relative_to(root)))
    return found


def test_a_password_in_the_base_url_reaches_no_file_and_no_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with ChatServer() as server:
        env = dict(os.environ)
        env.update(
            {
                "SUBSTRAT_OPENAI_BASE_URL": with_credentials(server.base_url),
                "SUBSTRAT_OPENAI_API_KEY": "loopback",
                "SUBSTRAT_OPENAI_MAX_RETRIES": "1",
            }
        )
        errors: list[str] = []
        with DaemonProcess(root, env=env).start(timeout_s=START_TIMEOUT_S):
            with Client(root) as client:
                client.call("agent.create", {"name": "a", "provider": "openai", "model": "m"})
                server.script(error(503, "overloaded"), error(503, "overloaded"))
                server.script(error(400, "no such model"))
                for prompt in ("retried, then failed", "rejected"):
                    with pytest.raises(RpcError) as failed:
                        client.call("agent.send", {"agent": "a", "prompt": prompt})
                    errors.append(str(failed.value))
                client.call("agent.send", {"agent": "a", "prompt": "works"})
        assert len(server.requests) == 4
        assert all((r.authorization or "").startswith("Basic ") for r in server.requests)
    assert PASSWORD not in " ".join(errors)
    assert f"openai endpoint {server.base_url} model m" in errors[0]
    assert files_holding(root, PASSWORD) == []
    assert "HTTP Request: POST http://***@127.0.0.1" in (root / "daemon.log").read_text()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (None, "api.openai.com"),
        ("http://localhost:11434/v1", "http://localhost:11434/v1"),
        ("https://u:p@gw.example/v1?api-key=k#x", "https://gw.example/v1"),
        ("http://u:p@[::1]:8000/v1", "http://[::1]:8000/v1"),
    ],
)
def test_the_endpoint_is_shown_without_credentials(url: str | None, shown: str) -> None:
    assert endpoint_label(url) == shown


def test_the_daemon_log_masks_url_credentials() -> None:
    line = 'POST https://bob:hunter2@gw.example/v1/chat?api-key=k123&x=1 "HTTP/1.1 200 OK"'
    assert redact(line) == 'POST https://***@gw.example/v1/chat?api-key=***&x=1 "HTTP/1.1 200 OK"'
