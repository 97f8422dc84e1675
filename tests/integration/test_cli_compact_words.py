"""``substrat compact`` as a user meets it: Ctrl-C in the middle, and the names in
``--dry-run`` (the outside review of session 17, items 3 and 4)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import made_roots
from tests.support.cli import SUBSTRAT, as_json, cli_env, cli_root, run

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="needs the substrat console script")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


A_TERMINATED_CHILD = (
    ("agent", "create", "lead"),
    ("agent", "send", "lead", "plan\n@spawn kid helper"),
    ("agent", "send", "lead", "more\n@send user done"),
    ("agent", "send", "lead/kid", "hi"),
    ("agent", "create", "other"),
    ("agent", "rm", "lead/kid"),
)


def a_root_with_a_terminated_child(root: Path, factory: pytest.TempPathFactory) -> None:
    """What these commands leave, the daemon stopped (a copy of it: tests/support/made_roots)."""
    made_roots.made_root(factory, root, commands=A_TERMINATED_CHILD)


# The real CLI, in a process of its own, that sends itself SIGINT (as Ctrl-C does) right
# after compaction has archived its first segment: a point inside the compaction. Its SIGINT
# is Python's own handler first, as in a shell's foreground command that a Ctrl-C reaches: a
# test run started in the background (`&`, a script's loop) hands its children SIGINT
# ignored, and the interrupt then never came (exit 0, the flake of session 18).
INTERRUPTED = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from substrat import segments
from substrat.cli import main
archive = segments.archive
sent = []
def archive_then_interrupt(segment):
    done = archive(segment)
    if not sent:
        sent.append(os.kill(os.getpid(), signal.SIGINT))
    return done
segments.archive = archive_then_interrupt
sys.argv = ["substrat", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("as_json_error", [False, True])
def test_ctrl_c_in_compact_says_what_state_the_root_is_in(
    root: Path, as_json_error: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    a_root_with_a_terminated_child(root, tmp_path_factory)
    args = [sys.executable, "-c", INTERRUPTED, "compact", "--segment-bytes", "1"]
    args += ["--json"] if as_json_error else []
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, env=cli_env(root))
    assert proc.returncode == 130, proc.stderr  # it used to be 130 with nothing said
    said = json.loads(proc.stderr)["error"]["message"] if as_json_error else proc.stderr
    assert (
        "compact interrupted: nothing lost; segments compacted so far are kept, run it again"
        in " ".join(said.split())
    )
    archived = {p.name for p in root.rglob("*.gz")}
    assert archived  # what it did before the interrupt is kept
    checked = run(root, "fsck", "--json")
    assert checked.returncode == 0, checked.stdout
    assert json.loads(checked.stdout)["findings"] == []

    again = run(root, "compact", "--segment-bytes", "1")  # what the message says to do
    assert again.returncode == 0, again.stderr
    assert archived <= {p.name for p in root.rglob("*.gz")}
    assert run(root, "fsck").returncode == 0
    listed = as_json(run(root, "agent", "list", "--all", "--json"))
    assert {a["path"] for a in listed} == {"lead", "lead/kid", "other"}


def test_dry_run_names_agents_by_their_path(
    root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    a_root_with_a_terminated_child(root, tmp_path_factory)
    planned = as_json(run(root, "compact", "--dry-run", "--json"))
    paths = sorted(str(item["path"]) for item in planned["logs"])
    assert paths == ["lead", "lead/kid", "other", "user"]
    table = run(root, "compact", "--dry-run").stdout
    rows = [line.split()[0] for line in table.splitlines()[2:] if line.startswith("  ")]
    assert sorted(rows) == ["lead", "lead/kid", "other", "user"]
