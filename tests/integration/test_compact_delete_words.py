"""``compact --policy delete`` says what it kept and why, ``compact`` on a running root
says what to do with this root, and ``--dry-run`` and the tree list agents as people
count (the outside review s19f, findings 7 and 2's neighbours)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.cli.compact_cmds import KEPT_NEWEST
from substrat.segments import list_sealed
from tests.support import made_roots
from tests.support.cli import SUBSTRAT, as_json, cli_root, run

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="needs the substrat console script")

FILLER = "x" * 200  # a few turns fill more than --segment-bytes 1024


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def send_turns(root: Path, first: int, count: int) -> None:
    for n in range(first, first + count):
        sent = run(root, "agent", "send", "a", f"turn {n} {FILLER}")
        assert sent.returncode == 0, sent.stderr


FOUR_TURNS = (
    ("agent", "create", "a"),
    *(("agent", "send", "a", f"turn {n} {FILLER}") for n in range(1, 5)),
)
"""``a`` and turns 1-4 (as :func:`send_turns` sends them), then the daemon stopped: the
root two of the tests start from (a copy of it: tests/support/made_roots)."""


def compact_delete(root: Path, *more: str) -> str:
    done = run(root, "compact", "--policy", "delete", "--segment-bytes", "1024", *more)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())


def test_delete_says_it_keeps_the_newest_segment_and_deletes_it_later(
    root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    made_roots.made_root(tmp_path_factory, root, commands=FOUR_TURNS)
    first = compact_delete(root)
    # One segment per log: it holds the checkpoint the base would need, so it is kept.
    assert "1 segment sealed, 1 archived, 0 deleted" in first, first
    assert " ".join(KEPT_NEWEST.split()) in first, first
    log_dir = next((root / "agents").iterdir())
    (kept,) = list_sealed(log_dir / "events.jsonl")
    assert kept.archived

    send_turns(root, 5, 4)
    assert run(root, "daemon", "stop").returncode == 0
    planned = as_json(
        run(root, "compact", "--dry-run", "--json", "--policy", "delete", "--segment-bytes", "1024")
    )
    (log,) = [item for item in planned["logs"] if item["path"] == "a"]
    assert log["to_seal"] and log["to_delete"] == [kept.name], log
    table = " ".join(
        run(
            root, "compact", "--dry-run", "--policy", "delete", "--segment-bytes", "1024"
        ).stdout.split()
    )
    assert "delete 1, seal the active file, archive it" in table, table
    second = compact_delete(root)
    assert "1 segment sealed, 1 archived, 1 deleted" in second, second
    assert [s.first for s in list_sealed(log_dir / "events.jsonl")] == [kept.last + 1]
    shown = as_json(run(root, "log", "a", "--json"))
    assert shown["deleted_through"] == kept.last
    prompts = [turn["prompt"] for turn in shown["turns"]]
    assert [p.split()[1] for p in prompts] == [str(n) for n in range(1, 9)], prompts


def test_nothing_to_delete_says_why(root: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    made_roots.made_root(tmp_path_factory, root, commands=FOUR_TURNS)
    compact_delete(root)
    planned = run(root, "compact", "--dry-run", "--policy", "delete")
    assert planned.returncode == 0, planned.stderr
    said = " ".join(planned.stdout.split())
    assert (
        "nothing to delete yet (each log keeps its newest sealed segment until a newer one "
        "is sealed)" in said
    ), said


def test_compact_on_a_running_root_says_stop_it_or_dry_run(root: Path) -> None:
    assert run(root, "agent", "create", "a").returncode == 0
    refused = run(root, "compact")
    assert refused.returncode == 2, refused.stderr
    message = " ".join(refused.stderr.split())
    assert message.startswith(f"error: {root} is in use by daemon pid "), message
    assert (
        f"run `substrat daemon stop --root {root}`, then `substrat compact --root {root}` again"
    ) in message
    assert "(`--dry-run` works while it serves" in message
    assert "another root" not in message
    assert run(root, "compact", "--dry-run").returncode == 0


def test_dry_run_prints_the_root_then_rows_in_name_order(root: Path) -> None:
    for name in ("c10", "c2", "c1", "b"):
        assert run(root, "agent", "create", name).returncode == 0
    assert run(root, "daemon", "stop").returncode == 0
    lines = run(root, "compact", "--dry-run").stdout.splitlines()
    assert lines[0].strip() == str(root), lines
    assert lines[1].split()[0] == "LOG", lines
    rows = [line.split()[0] for line in lines[2:-1]]
    assert rows == ["b", "c1", "c2", "c10"], lines


def test_tree_and_list_sort_children_as_people_count(root: Path) -> None:
    assert run(root, "agent", "create", "lead").returncode == 0
    spawns = "\n".join(f"@spawn c{n} helper" for n in (10, 2, 11, 1))
    assert run(root, "agent", "send", "lead", f"go\n{spawns}").returncode == 0
    listed = as_json(run(root, "agent", "list", "--json"))
    assert [a["path"] for a in listed] == ["lead", "lead/c1", "lead/c2", "lead/c10", "lead/c11"]
    tree = run(root, "agent", "tree").stdout
    kids = {"c1", "c2", "c10", "c11"}  # not a short id, which may start with a c too
    order = [name for line in tree.splitlines() for name in line.split() if name in kids]
    assert order == ["c1", "c2", "c10", "c11"], tree
