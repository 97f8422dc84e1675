"""A root an older substrat made, opened by this one (docs/daemon.md, "Upgrading and going
back"): the first process that writes to it, once it holds it, marks it as format 2, so a
version that reads only format 1 refuses it instead of misreading the segments, bases and
checkpoints this one writes (one from before segments terminated live agents as crashed
creations). Reading leaves the marker as it is, and so does a command refused the root
because a daemon (an older one, in mid-upgrade) serves it. Real roots, real daemons.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat import persistence, rootmarker
from substrat.errors import RootUnusableError
from substrat.orchestrator import Orchestrator
from substrat.rootdir import MARKER_NAME, require_root
from tests.support.cli import SUBSTRAT, run, stop_or_kill

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")

OLDER = {
    "format": "substrat-root",
    "version": 1,
    "created_at": "2026-11-20T08:00:00.000000+00:00",
    "created_by": "substrat 0.1.0",
}
"""The marker every substrat before format 2 wrote."""


def mark_older(root: Path) -> bytes:
    body = json.dumps(OLDER).encode() + b"\n"
    (root / MARKER_NAME).write_bytes(body)
    return body


def marker(root: Path) -> dict[str, object]:
    body = json.loads((root / MARKER_NAME).read_text())
    assert isinstance(body, dict)
    return body


@pytest.fixture(scope="module")
def older_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A stopped root with a tree and a turn, marked as an older version marked it."""
    root = tmp_path_factory.mktemp("older") / "root"
    try:
        assert run(root, "agent", "create", "lead").returncode == 0
        sent = run(root, "agent", "send", "lead", "-", stdin="go\n@spawn scout Look.\n")
        assert sent.returncode == 0, sent.stderr
        assert run(root, "daemon", "stop").returncode == 0
    finally:
        stop_or_kill(root)
    mark_older(root)
    yield root


def copy_of(older_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(older_root, root, symlinks=True)
    return root


def test_reading_an_older_root_leaves_its_marker(older_root: Path, tmp_path: Path) -> None:
    root = copy_of(older_root, tmp_path)
    before = (root / MARKER_NAME).read_bytes()
    for args in (
        ("fsck",),
        ("compact", "--dry-run"),
        ("recover", "--dry-run"),
        ("agent", "list", "--no-autostart"),
    ):
        run(root, *args)
        assert (root / MARKER_NAME).read_bytes() == before, args


@pytest.mark.parametrize(
    "writer", [("daemon", "start"), ("compact",), ("recover",), ("fsck", "--repair")]
)
def test_the_first_writer_marks_an_older_root_as_format_2(
    older_root: Path, tmp_path: Path, writer: tuple[str, ...]
) -> None:
    root = copy_of(older_root, tmp_path)
    if writer == ("fsck", "--repair"):  # a clean root gets no repair, and no write
        (root / "agents" / ("session.json" + persistence.TMP_SUFFIX)).write_text("{")
    try:
        done = run(root, *writer)
        assert done.returncode == (1 if writer[0] == "fsck" else 0), done.stdout + done.stderr
        assert marker(root) == {
            **OLDER,  # made then, by that version
            "version": rootmarker.MARKER_VERSION,
            "upgraded_from": 1,
        }
        assert rootmarker.MARKER_VERSION == 2
        listed = run(root, "agent", "list", "--json")
        assert sorted(a["path"] for a in json.loads(listed.stdout)) == ["lead", "lead/scout"]
    finally:
        stop_or_kill(root)


def test_a_command_refused_a_served_root_leaves_its_marker(
    older_root: Path, tmp_path: Path
) -> None:
    """Mid-upgrade: an older daemon serves the root (played by this one's daemon with the
    older marker put back): what this version is refused, or only reads through the
    daemon, does not mark the root; its restart, holding the root, does."""
    root = copy_of(older_root, tmp_path)
    try:
        assert run(root, "daemon", "start").returncode == 0
        before = mark_older(root)
        for args, code in (
            (("daemon", "start"), 0),  # already running
            (("agent", "create", "second"), 0),
            (("compact",), 2),
            (("recover",), 2),
            (("fsck", "--repair"), 2),
        ):
            done = run(root, *args)
            assert done.returncode == code, (args, done.stdout + done.stderr)
            assert (root / MARKER_NAME).read_bytes() == before, args
        assert run(root, "daemon", "restart").returncode == 0
        assert marker(root)["version"] == 2
    finally:
        stop_or_kill(root)


def test_a_library_opening_an_older_root_marks_it_and_one_without_a_marker_stays_so(
    tmp_path: Path,
) -> None:
    older, library = tmp_path / "older", tmp_path / "library"
    older.mkdir(mode=0o700)
    mark_older(older)

    async def open_close(path: Path) -> None:
        orch = await Orchestrator.open(path)
        await orch.close()

    asyncio.run(open_close(older))
    assert marker(older)["version"] == 2
    asyncio.run(open_close(library))
    assert not (library / MARKER_NAME).exists()  # a library root carries no marker


def test_a_format_2_root_is_refused_by_a_reader_of_format_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an older version does with a root this one marked (it reads only format 1)."""
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    rootmarker.write(root)
    monkeypatch.setattr("substrat.rootdir.MARKER_VERSION", 1)
    with pytest.raises(RootUnusableError, match=r"format 2, newer than .* upgrade substrat"):
        require_root(root)
