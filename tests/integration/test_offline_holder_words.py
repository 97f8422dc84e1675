"""fsck, recover and compact on a root another offline command holds: each names the
holder and its command, and says when to retry, as a daemon's start does (``the root R is
being compacted by pid N (substrat compact); retry when it ends``), instead of "another
substrat process (fsck, recover or a starting daemon)" and `substrat daemon stop` (no
daemon runs). Real processes: the holder is a program whose command line reads as
``substrat compact`` and holds the root as compact does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import holders, made_roots
from tests.support.cli import SUBSTRAT, cli_root, run

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


@pytest.fixture
def compacting(
    root: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    """A `substrat compact` holding ``root`` (made by `agent create lead`, stopped: a copy
    of one, tests/support/made_roots) for the test; its pid."""
    made_roots.made_root(tmp_path_factory, root)
    with holders.compacting(root, tmp_path) as holder:
        yield holder.pid


@pytest.mark.parametrize(
    "command",
    [("fsck",), ("fsck", "--repair"), ("recover",), ("compact",)],
    ids=" ".join,
)
def test_an_offline_command_names_the_compaction_that_holds_the_root(
    root: Path, compacting: int, command: tuple[str, ...]
) -> None:
    refused = run(root, *command, "--root", str(root))
    assert refused.returncode != 0
    said = " ".join(refused.stderr.split())
    assert (
        f"the root {root} is being compacted by pid {compacting} (substrat compact); "
        "retry when it ends" in said
    ), said
    assert "daemon stop" not in said and "starting daemon" not in said, said
