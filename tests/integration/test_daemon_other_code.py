"""Mid-upgrade (docs/daemon.md, "Upgrading and going back"): ``daemon start`` finds a daemon
of another substrat serving the root (every version says 0.1.0) and says so, with
``daemon restart`` as the way to run this one; ``daemon status`` says it too. The other
substrat is a real copy of the package, started as its own daemon process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import substrat
from substrat.client import ping
from tests.support import made_roots
from tests.support.cli import SUBSTRAT, cli_env, run, stop_or_kill

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")


def other_installation(tmp_path: Path, *, says_its_code: bool) -> Path:
    """A copy of this substrat elsewhere (as another venv holds one); without
    ``says_its_code``, its daemon's status lacks ``code``, as every version before it did."""
    site = tmp_path / "other-site"
    shutil.copytree(
        os.path.dirname(substrat.__file__),
        site / "substrat",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    if not says_its_code:
        daemon_py = site / "substrat" / "daemon.py"
        text = daemon_py.read_text()
        assert '"code": codeid.CODE,' in text
        daemon_py.write_text(text.replace('"code": codeid.CODE,', ""))
    return site


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "root"
    yield path
    stop_or_kill(path)


def start_other(site: Path, root: Path, factory: pytest.TempPathFactory) -> subprocess.Popen[bytes]:
    made_roots.made_root(factory, root)  # made by this one (`agent create lead`), stopped
    env = {**cli_env(root), "PYTHONPATH": str(site)}
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "substrat.daemon", "--root", str(root)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while ping(root) is None:
        assert proc.poll() is None and time.monotonic() < deadline, "the other daemon did not serve"
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("says_its_code", [True, False])
def test_daemon_start_names_a_daemon_of_another_substrat(
    tmp_path: Path, root: Path, says_its_code: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    site = other_installation(tmp_path, says_its_code=says_its_code)
    other = start_other(site, root, tmp_path_factory)
    try:
        started = run(root, "daemon", "start")
        assert started.returncode == 0, started.stderr
        text = " ".join(started.stdout.split())
        assert f"daemon already running (pid {other.pid})" in text
        which = (
            f"the substrat installed at {site / 'substrat'}"
            if says_its_code
            else "an older substrat, which does not say which code it runs"
        )
        assert f"it runs {which}, not this command's" in text
        assert f"`substrat daemon restart --root {root}` runs this one" in text
        as_json = json.loads(run(root, "daemon", "start", "--json").stdout)
        assert as_json["started"] is False and which in as_json["other_code"]
        status = " ".join(run(root, "daemon", "status").stdout.split())
        assert f"it runs {which}, not this command's" in status
        restarted = run(root, "daemon", "restart")
        assert restarted.returncode == 0, restarted.stderr
        assert other.wait(timeout=30) == 0
        again = run(root, "daemon", "start")
        assert "daemon already running" in again.stdout and "it runs" not in again.stdout
        assert json.loads(run(root, "daemon", "start", "--json").stdout)["other_code"] is None
        listed = json.loads(run(root, "agent", "list", "--json").stdout)
        assert [a["path"] for a in listed] == ["lead"]
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
