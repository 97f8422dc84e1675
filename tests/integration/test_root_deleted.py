"""A log file deleted under a running daemon (its agent's directory, or the whole root,
removed with ``rm -rf``): nothing more written to it is acknowledged.

The daemon writes through descriptors it opened earlier: after the removal its writes and
fsyncs still succeed, into a file no directory names, and it acknowledged turns nothing can
ever read (``eventlog._check_linked`` now refuses them). The root itself gone is also the
daemon's root check's business; an agent's directory alone is this check's only.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from substrat.client import Client, DaemonProcess
from substrat.errors import RpcError
from substrat.rpc import protocol


def test_a_turn_into_an_agent_directory_removed_under_the_daemon_is_refused(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    with DaemonProcess(root, daemon_args=["--no-wake"]), Client(root, timeout_s=60) as client:
        lead = client.call("agent.create", {"name": "lead"})
        client.call("agent.create", {"name": "other"})
        client.call("agent.send", {"agent": "lead", "prompt": "before"})
        shutil.rmtree(root / "agents" / lead["session_id"])
        with pytest.raises(RpcError) as refused:
            client.call("agent.send", {"agent": "lead", "prompt": "into a deleted file"})
        assert refused.value.code == protocol.DURABILITY_FAILED, refused.value
        assert "was deleted while open" in refused.value.message, refused.value.message
        # the others are served as before
        answer = client.call("agent.send", {"agent": "other", "prompt": "still here?"})
        assert answer["turn_id"] == "t1"
