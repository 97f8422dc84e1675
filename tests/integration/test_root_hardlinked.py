"""A copy of a root made with hard links (`cp -al`) is refused, and so is the original
while the copy shares its files (docs/daemon.md, "Which directory is a root";
substrat/rootlinks.py).

An outside review made such a copy of a stopped root and started the original's daemon:
the copy's commands named that daemon as their own (`daemon.lock` is one inode for both),
`daemon restart` on the copy, as advised, stopped it, and the copy's daemon then wrote its
turns into the original's logs. Real daemons, real CLI processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import SUBSTRAT, cli_roots, run

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")


@pytest.fixture
def roots() -> Iterator[list[Path]]:
    yield from cli_roots()


def logs(root: Path) -> dict[Path, bytes]:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.glob("agents/*/events*"))}


def test_a_hard_linked_copy_never_touches_the_original_or_its_daemon(
    tmp_path: Path, roots: list[Path]
) -> None:
    roots += [original := tmp_path / "team", copy := tmp_path / "team-snapshot"]
    made = run(original, "agent", "create", "lead")
    sent = run(original, "agent", "send", "lead", "one")
    assert made.returncode == sent.returncode == 0, (made.stderr, sent.stderr)
    pid = int(run(original, "daemon", "status", "--pid").stdout)
    subprocess.run(["cp", "-al", str(original), str(copy)], check=True)
    before = logs(original)

    for args in (
        ("daemon", "restart"),  # the advice the copy got: it stopped the original's daemon
        ("daemon", "stop"),
        ("agent", "send", "lead", "from the copy"),
        ("daemon", "status"),
    ):
        out = run(copy, *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "hard links" in out.stderr and "cp -a" in out.stderr, out.stderr
    os.kill(pid, 0)  # the original's daemon still runs
    assert logs(original) == before

    # the daemon process itself refuses it too (one line in its log, exit 2)
    assert run(original, "daemon", "stop").returncode == 2  # the original is linked too
    os.kill(pid, 15)
    daemon = subprocess.run(
        [sys.executable, "-m", "substrat.daemon", "--root", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert daemon.returncode == 2 and "hard links" in daemon.stderr, daemon.stderr

    # a real copy instead: both roots are usable and each keeps its own turns
    real = tmp_path / "team-copy"
    roots.append(real)
    subprocess.run(["cp", "-a", str(copy), str(real)], check=True)
    shutil.rmtree(copy)
    assert run(real, "agent", "send", "lead", "from the real copy").returncode == 0
    assert run(original, "agent", "send", "lead", "two").returncode == 0
    assert "from the real copy" not in run(original, "log", "lead").stdout
    assert "two" not in run(real, "log", "lead").stdout
