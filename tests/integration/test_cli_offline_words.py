"""What the offline commands say, as a user reads it: ``compact --dry-run`` in the words
of the policy asked about, and ``fsck``'s findings whole at 80 columns (issue 16, item 3).
"""

from __future__ import annotations

import asyncio
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


def _findings_shown(lines: list[str]) -> list[tuple[str, str, str]]:
    """(kind, file, detail) of each finding fsck printed on a terminal too narrow for its
    table: the file on a line of its own (indented 2), then severity, kind and detail,
    wrapped (indented 4), then the repair."""
    shown: list[tuple[str, str, str]] = []
    facts: list[str] = []
    name = ""

    def flush() -> None:
        if name:
            said = " ".join(facts).split(" repair: ")[0]
            _severity, kind, detail = said.split(" ", 2)
            shown.append((kind.rstrip(":"), name, detail))

    for line in lines:
        if line.startswith("    "):
            facts.append(line.strip())
        elif line.startswith("  "):
            flush()
            name, facts = line.strip(), []
        else:  # a group's title line
            flush()
            name, facts = "", []
    flush()
    return shown


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
    body = [line for line in text[1:-1] if line.strip()]
    assert all(len(line) <= 80 for line in body), shown.stdout
    assert "…" not in "".join(body), shown.stdout  # nothing cut
    # a sealed segment's name (53 characters) leaves no room for a table: each name whole
    # on a line of its own, never folded (it was "events.0000000000000000000" over "1-0...")
    assert f"  {first.name}" in body, shown.stdout
    rows = _findings_shown(body)
    assert len(rows) == len(findings), shown.stdout
    assert any(first.name in f["path"] for f in findings), findings

    def squeezed(text: str) -> str:
        return "".join(text.split())

    shown_rows = sorted((kind, file, squeezed(detail)) for kind, file, detail in rows)
    expected = sorted((f["kind"], f["path"], squeezed(f["detail"])) for f in findings)
    for (kind, file, detail), (want_kind, path, want_detail) in zip(
        shown_rows, expected, strict=True
    ):
        assert (kind, detail) == (want_kind, want_detail), shown.stdout
        assert path.endswith(file), shown.stdout  # an agent's file, below its session
