"""``substrat compact`` as a user meets it: Ctrl-C in the middle, and the names in
``--dry-run`` (the outside review of session 17, items 3 and 4)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import SUBSTRAT, as_json, cli_root, run

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="needs the substrat console script")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def a_root_with_a_terminated_child(root: Path) -> None:
    assert run(root, "agent", "create", "lead").returncode == 0
    for prompt in ("plan\n@spawn kid helper", "more\n@send user done"):
        assert run(root, "agent", "send", "lead", prompt).returncode == 0
    assert run(root, "agent", "send", "lead/kid", "hi").returncode == 0
    assert run(root, "agent", "create", "other").returncode == 0
    assert run(root, "agent", "rm", "lead/kid").returncode == 0
    assert run(root, "daemon", "stop").returncode == 0


def test_dry_run_names_agents_by_their_path(root: Path) -> None:
    a_root_with_a_terminated_child(root)
    planned = as_json(run(root, "compact", "--dry-run", "--json"))
    paths = sorted(str(item["path"]) for item in planned["logs"])
    assert paths == ["lead", "lead/kid", "other", "user"]
    table = run(root, "compact", "--dry-run").stdout
    rows = [line.split()[0] for line in table.splitlines()[2:] if line.startswith("  ")]
    assert sorted(rows) == ["lead", "lead/kid", "other", "user"]
