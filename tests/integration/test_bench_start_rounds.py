"""oracle.bench_start_rounds: interleaved daemon starts leave the measured root as it was."""

from __future__ import annotations

import hashlib
from pathlib import Path

from oracle.bench_checkpoints import checkpoint_root
from oracle.bench_scale import generate_root
from oracle.bench_start_rounds import KINDS, run_rounds, summary
from substrat.checkpoints import store_path

REPO = str(Path(__file__).resolve().parents[2])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_rounds_start_every_code_on_every_root_and_leave_the_store_as_it_was(
    tmp_path: Path,
) -> None:
    root = generate_root(tmp_path / "root", 4, 10)
    checkpoint_root(root.path)
    before = _digest(store_path(root.path))
    codes = {"a": REPO, "b": REPO}
    said: list[str] = []
    results = run_rounds(root, codes, 1, seed=7, say=said.append)
    assert sorted(results) == sorted((name, kind) for name in codes for kind in KINDS)
    assert all(len(items) == 1 for items in results.values())
    assert {r.agents for (_, kind), items in results.items() if kind != "empty" for r in items} == {
        4
    }
    assert len(said) == len(codes) * len(KINDS)
    # the start without the store got none (its clean stop's is removed), and the one with
    # it found the same store every time
    assert _digest(store_path(root.path)) == before
    lines = summary(root, codes, results)
    assert any(line.startswith("a: ratio, CPU, per round: ") for line in lines)
