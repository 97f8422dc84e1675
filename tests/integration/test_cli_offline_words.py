"""What the offline commands say, as a user reads it: ``compact --dry-run`` in the words
of the policy asked about, and ``fsck``'s findings whole at 80 columns (issue 16, item 3).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import pytest

from substrat.checkpointer import CheckpointPolicy
from substrat.orchestrator import Orchestrator
from substrat.segments import list_sealed
from tests.support.cli import SUBSTRAT, run

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")


def _root(tmp_path: Path, policy: CheckpointPolicy) -> Path:
    root = tmp_path / "root"

    async def go() -> None:
        orch = await Orchestrator.open(root, checkpoints=policy)
        await orch.create_root("lead", "You coordinate.")
        for i in range(8):
            await orch.run_turn("lead", f"turn {i} " + "x" * 200)
        await orch.close()

    asyncio.run(go())
    return root


def test_compact_dry_run_speaks_of_the_policy_asked_about(tmp_path: Path) -> None:
    root = _root(tmp_path, CheckpointPolicy())  # 8 MiB segments: nothing sealed
    deleting = run(root, "compact", "--policy", "delete", "--dry-run")
    assert deleting.returncode == 0, deleting.stderr
    assert "nothing to delete yet" in deleting.stdout, deleting.stdout
    assert "archive" not in deleting.stdout.split(" on disk; ")[1], deleting.stdout
    archiving = run(root, "compact", "--dry-run")
    assert "nothing to archive yet" in archiving.stdout, archiving.stdout


def _columns(lines: list[str], headers: list[str]) -> list[dict[str, str]]:
    """The rows of a (possibly folded) table, each column's text joined over its lines.

    A row starts on a line whose first column is not blank; the lines after it (blank
    there) continue it.
    """
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == headers[:1])
    starts = [lines[head].index(h) for h in headers] + [10_000]
    rows: list[dict[str, str]] = []
    for line in lines[head + 1 :]:
        if not line.startswith(" "):
            continue  # a group's title line
        cells = [line[a:b].strip() for a, b in itertools.pairwise(starts)]
        if cells[0]:
            rows.append(dict.fromkeys(headers, ""))
        for header, cell in zip(headers, cells, strict=True):
            rows[-1][header] += cell
    return rows


def test_fsck_shows_whole_paths_and_details_at_80_columns(tmp_path: Path) -> None:
    root = _root(tmp_path, CheckpointPolicy(every_entries=4, segment_bytes=1500))
    (agent_dir,) = (root / "agents").iterdir()
    first = list_sealed(agent_dir / "events.jsonl")[0]
    lines = first.path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"seq"', b'"sex"')  # a bad checksum in a sealed segment
    first.path.write_bytes(b"".join(lines))

    shown = run(root, "fsck", columns=80)
    findings = json.loads(run(root, "fsck", "--json").stdout)["findings"]
    text = shown.stdout.splitlines()
    table = [line for line in text[1:-1] if line.strip()]
    assert all(len(line) <= 80 for line in table), shown.stdout
    assert "…" not in "".join(table), shown.stdout  # nothing cut
    rows = _columns(table, ["SEVERITY", "KIND", "FILE", "DETAIL", "REPAIR"])
    assert len(rows) == len(findings), shown.stdout
    assert any(first.name in f["path"] for f in findings), findings

    def squeezed(text: str) -> str:
        return "".join(text.split())

    shown_rows = sorted((r["KIND"], squeezed(r["FILE"]), squeezed(r["DETAIL"])) for r in rows)
    expected = sorted((f["kind"], squeezed(f["path"]), squeezed(f["detail"])) for f in findings)
    for (kind, file, detail), (want_kind, path, want_detail) in zip(
        shown_rows, expected, strict=True
    ):
        assert (kind, detail) == (want_kind, want_detail), shown.stdout
        assert path.endswith(file), shown.stdout  # an agent's file, below its session
    assert any(row["FILE"] == first.name for row in rows), shown.stdout
