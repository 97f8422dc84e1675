"""A root inside another root (docs/daemon.md, "Which directory is a root"), through the real CLI.

A new root is never made inside an existing one (under its ``agents/``, ``user/``,
``quarantine/`` or anywhere else): the outer root's fsck would take it for damage and
move it, or its daemon would write its inbox into it. A root made there by an older
version is reported by the outer root's fsck and start, and never moved, even by
``fsck --repair``, even while its own daemon runs in it; one at ``user/``, where the
outer daemon would write its inbox, keeps the outer daemon from starting until it is
moved out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from substrat.rpc import lock
from tests.support import made_roots, warm
from tests.support.cli import NOT_INSTALLED, SUBSTRAT, stop_all, stop_or_kill

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason=NOT_INSTALLED)

MARKER_NAME = "substrat-root.json"  # docs/daemon.md names it
CREATING = [
    ("daemon", "start"),
    ("daemon", "start", "--foreground"),
    ("daemon", "restart"),
    ("agent", "create", "lead"),
    ("<daemon>",),  # python -m substrat.daemon --root R: the daemon process itself
]
_TOUCHED: list[Path] = []


@pytest.fixture(autouse=True)
def _no_daemon_left_behind() -> Iterator[None]:
    yield
    stop_all(_TOUCHED)


def run(root: Path, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    _TOUCHED.append(root)
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("SUBSTRAT_NO_AUTOSTART", None)
    env.pop("SUBSTRAT_HOME", None)
    if args == ("<daemon>",):
        command = [sys.executable, "-m", "substrat.daemon", "--root", str(root)]
    else:
        command = [SUBSTRAT, *args, "--root", str(root)]
    return warm.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)


def files(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` and its content (directories by name)."""
    found: dict[str, bytes] = {}
    for current, dirs, names in os.walk(path):
        for name in dirs:
            found[os.path.relpath(Path(current, name), path) + "/"] = b""
        for name in names:
            full = Path(current, name)
            found[os.path.relpath(full, path)] = full.read_bytes() if full.is_file() else b""
    return found


MadeRoot = Callable[..., Path]


@pytest.fixture
def made_root(tmp_path_factory: pytest.TempPathFactory) -> MadeRoot:
    """``made_root(path, agent="lead")``: at ``path``, a root as ``substrat agent create
    AGENT`` leaves it, its daemon stopped (a copy of one made once: tests/support/made_roots)."""

    def make(path: Path, agent: str = "lead") -> Path:
        return made_roots.made_root(tmp_path_factory, path, agent)

    return make


@pytest.mark.parametrize(
    "inside",
    ["agents/mywork", "user", "quarantine", "roots/new", "terminated", "a/b/c", "empty"],
)
def test_no_root_is_made_inside_a_root(tmp_path: Path, inside: str, made_root: MadeRoot) -> None:
    outer = made_root(tmp_path / "outer")
    if inside == "empty":
        (outer / inside).mkdir(mode=0o700)  # an empty private directory is adopted elsewhere
    before = files(outer)
    for args in CREATING:
        proc = run(outer / inside, *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 or args == ("<daemon>",), proc.stderr
        assert f"cannot make a substrat root at {outer / inside}" in proc.stderr, args
        assert f"inside the substrat root {outer} (under its {inside.split('/')[0]}/)" in (
            proc.stderr
        )
        assert files(outer) == before, args  # nothing made, nothing written
    assert not lock.is_held(outer / inside)


def test_no_root_is_made_inside_a_root_through_a_symlink(
    tmp_path: Path, made_root: MadeRoot
) -> None:
    outer = made_root(tmp_path / "outer")
    link = tmp_path / "link"
    link.symlink_to(outer / "agents")
    before = files(outer)
    proc = run(link / "mywork", "agent", "create", "x")
    assert proc.returncode == 2, proc.stderr
    assert f"inside the substrat root {outer} (under its agents/)" in proc.stderr
    assert files(outer) == before


def test_a_root_above_a_root_is_refused(tmp_path: Path, made_root: MadeRoot) -> None:
    above = tmp_path / "above"
    made_root(above / "inner")
    # a root whose name is a session id's, in a directory called agents: the directory
    # above looks like a root from before the marker, but one holding a root is not one
    hidden = tmp_path / "hidden"
    (hidden / "agents").mkdir(parents=True, mode=0o700)
    os.chmod(hidden, 0o700)
    made_root(hidden / "agents" / ("a" * 32))
    for path in (above, hidden):
        before = files(path)
        for args in CREATING[:4]:
            proc = run(path, *args)
            assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
            assert f"{path} is not a substrat root and not empty" in proc.stderr, args
            assert files(path) == before, args


def _nest(made_root: MadeRoot, root: Path, where: Path) -> Path:
    """A root made elsewhere and moved to ``where`` inside ``root`` (as an older version
    let ``substrat --root WHERE agent create x`` make it there), its daemon running."""
    made_root(root.parent / f"made-{where.name}", agent="x")
    where.parent.mkdir(parents=True, exist_ok=True)
    os.rename(root.parent / f"made-{where.name}", where)
    sent = run(where, "agent", "send", "x", "important work")
    assert sent.returncode == 0, sent.stderr
    assert lock.is_held(where)
    return where


def fsck(root: Path, *flags: str) -> tuple[int, dict[str, dict[str, object]]]:
    proc = run(root, "fsck", *flags, "--json")
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    return proc.returncode, {f["path"]: f for f in report["findings"]}


def test_the_outer_root_reports_a_nested_root_and_never_moves_it(
    tmp_path: Path, made_root: MadeRoot
) -> None:
    outer = made_root(tmp_path / "outer")
    nested = [
        _nest(made_root, outer, outer / "agents" / "mywork"),
        _nest(made_root, outer, outer / "user"),
        _nest(
            made_root, outer, outer / "quarantine" / "bad-name.mywork.0"
        ),  # an older fsck moved it
    ]
    held = outer / "agents" / "held"  # a root without the marker, its lock held
    held.mkdir(mode=0o700)
    holder = lock.RootLock.acquire(held)
    try:
        before = {path: files(path) for path in [*nested, held]}
        code, found = fsck(outer)  # --repair: refused below, as everything that writes
        assert code == 1, found
        for path in [*nested, held]:
            finding = found[str(path.relative_to(outer))]
            assert finding["kind"] == "nested_root" and finding["severity"] == "damage"
            assert "a substrat root inside this one" in str(finding["detail"])
            assert "move it out by hand" in str(finding["detail"])
            assert not finding["repaired"]
        assert {path: files(path) for path in [*nested, held]} == before  # never changed
        # The root at user/ is where the outer daemon would write its inbox: it refuses to
        # serve, saying how to move it out, before anything is written there.
        at_user = outer / "user"
        writers = (("daemon", "start"), ("agent", "list"), ("compact",), ("recover",))
        for args in (*writers, ("fsck", "--repair")):
            refused = run(outer, *args)
            assert refused.returncode == 2, (args, refused.stdout, refused.stderr)
            said = " ".join(refused.stderr.split())
            doing = {"compact": "compact", "recover": "recover", "fsck": "repair"}.get(
                args[0], "serve"
            )
            assert f"cannot {doing} {outer}: its user/ is a substrat root of its own" in said
            assert f"`substrat daemon stop --root {at_user}`, `mv {at_user} DEST`" in said
        assert files(at_user) == before[at_user]  # the outer inbox not written there either
        assert not lock.is_held(outer)
        moved = tmp_path / "moved-out"  # as the message says
        assert run(at_user, "daemon", "stop").returncode == 0
        os.rename(at_user, moved)
        nested[1] = moved
        code, found = fsck(outer, "--repair")  # the others: reported, never moved
        assert code == 1, found
        for path in (nested[0], nested[2], held):
            finding = found[str(path.relative_to(outer))]
            assert finding["kind"] == "nested_root" and not finding["repaired"]
            assert files(path) == before[path]
        started = run(outer, "daemon", "start")
        assert started.returncode == 0, started.stderr
        for name in ("mywork", "held"):
            assert f"left in place: agents/{name} (a substrat root inside this one" in (
                started.stdout
            )
        stop_or_kill(outer)
    finally:
        holder.release()
    for path in nested:  # each still there, its daemon still serving it (or again)
        sent = run(path, "agent", "send", "x", "more work")
        assert sent.returncode == 0, (path, sent.stderr)
        assert lock.is_held(path)
