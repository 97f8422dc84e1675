"""With no daemon, a client says what it found at the socket's place, in words: no
socket file, or a socket file no process listens on (a daemon killed with SIGKILL
leaves one), not a bare ``(No such file or directory)``."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from substrat.client import Client
from substrat.errors import DaemonNotRunningError


def test_no_socket_file_is_said_with_its_path(tmp_path: Path) -> None:
    client = Client(tmp_path)
    with pytest.raises(DaemonNotRunningError) as refused:
        client.connect(timeout_s=5)
    text = str(refused.value)
    assert f"(no socket at {client.socket_path})" in text, text
    assert "No such file" not in text, text


def test_a_socket_nobody_listens_on_is_said_to_refuse(tmp_path: Path) -> None:
    client = Client(tmp_path)
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(client.socket_path))
    left.close()  # the file stays; nothing listens: what SIGKILL leaves
    with pytest.raises(DaemonNotRunningError) as refused:
        client.connect(timeout_s=5)
    text = str(refused.value)
    assert f"({client.socket_path} refuses connections: its daemon is gone)" in text, text
