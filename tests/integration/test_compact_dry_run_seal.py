"""``compact --dry-run`` and ``--segment-bytes`` (finding 9 of the s17c outsider review):
the dry run said "nothing to delete yet" for every log while the real run with the same
options sealed and archived each active file. It now plans the sealing it would do."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import SUBSTRAT, as_json, cli_root, run

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def test_the_dry_run_shows_the_sealing_the_real_run_does(root: Path) -> None:
    run(root, "agent", "create", "lead", "--provider", "scripted")
    for number in range(3):
        assert run(root, "agent", "send", "lead", f"hello {number}").returncode == 0
    assert run(root, "daemon", "stop").returncode == 0
    small = ["--policy", "delete", "--segment-bytes", "100"]

    default = as_json(run(root, "compact", "--dry-run", "--json", *small[:2]))
    assert not any(item["to_seal"] for item in default["logs"])  # under the 8 MiB default
    planned = as_json(run(root, "compact", "--dry-run", "--json", *small))
    sealing = [item["endpoint"] for item in planned["logs"] if item["to_seal"]]
    assert sealing, planned
    text = run(root, "compact", "--dry-run", *small).stdout
    assert f"{len(sealing)} active file" in text and "to seal and archive" in text
    assert "nothing to delete yet" not in text

    done = as_json(run(root, "compact", "--json", *small))
    assert done["sealed"] == len(sealing)
    assert done["archived"] == len(sealing)
