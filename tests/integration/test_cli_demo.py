"""``substrat demo``: a real daemon, SIGKILLed mid-run, restarted; what came back."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from substrat.cli.common import Opts
from substrat.cli.offline_cmds import _print_demo
from tests.support.cli import NOT_INSTALLED, SUBSTRAT


@pytest.mark.skipif(not SUBSTRAT, reason=NOT_INSTALLED)
def test_demo_kills_the_daemon_and_shows_what_came_back(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [SUBSTRAT, "demo", "--json"], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["survived"] is True
    assert result["first_pid"] != result["second_pid"]
    assert "died (crashed or was killed)" in result["in_flight"]["error"]
    notice = result["recovered"]
    assert notice["previous_shutdown"] == "unclean"
    lost = notice["report"]["lost_turns"]
    assert ("t3", result["in_flight"]["prompt"]) in [(t["turn_id"], t["prompt"]) for t in lost]
    assert result["in_flight"]["prompt"].startswith("Plan the next phase.")
    assert notice["report"]["redelivered"], "the crew's unread messages come back"
    assert set(result["histories"]) == {"lead", "lead/builder", "lead/scout"}
    assert [t["turn_id"] for t in result["histories"]["lead"]] == ["t1", "t2"]
    assert all(result["histories"][p] for p in ("lead/builder", "lead/scout"))
    assert result["fsck"]["exit_code"] == 0
    assert not Path(result["root"]).exists(), "the temporary root is removed"

    # The same result, rendered for people.
    runner = CliRunner()
    with runner.isolation() as (out, _err, _in):
        _print_demo(Opts(root=tmp_path), result, keep=False)
    text = out.getvalue().decode()
    assert "lost in flight: lead turn t3" in text
    assert "every acknowledged turn survived: yes" in text
    assert "fsck after a clean stop: exit 0" in text
