"""Upkeep commands on a root they cannot read or write, and another user's daemon.

docs/daemon.md promises one line saying why and what to do, exit 2, for a root
that cannot be used: never a traceback. The cases an operator met:

* another user's root (here root's, run as uid 65534 with ``setpriv``): every
  reading and upkeep command (``fsck``, ``compact``, ``recover``, ``daemon
  status/stop``) says whose root it is, as ``agent list`` did;
* a root of one's own whose ``agents/`` or ``daemon.lock`` is at mode 000 (run
  without DAC override, as its non-root owner would be): the file and the
  ``chown``/``chmod`` to run;
* the CLI of one user against the running daemon of another: not "closed the
  connection ... run `daemon start` to recover" (a crash, maybe a side effect)
  but that the daemon runs as that user and refuses others.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.client import Client
from substrat.errors import DaemonDiedError, RootPermissionError, RpcError
from substrat.rpc import protocol
from tests.support import made_roots, roots, warm
from tests.support.privileges import OTHER_UID, as_other_user, unprivileged, why_not_available

UPKEEP = [
    ("fsck",),
    ("fsck", "--repair"),
    ("compact",),
    ("compact", "--dry-run"),
    ("recover",),
    ("recover", "--dry-run"),
    ("daemon", "status"),
    ("daemon", "stop"),
]


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture
def other_user() -> tuple[list[str], dict[str, str]]:
    how = as_other_user()
    if isinstance(how, str):
        pytest.skip(f"cannot run a command as uid {OTHER_UID}: {how}")
    return how


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory both users can reach (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="substrat-users-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _as(
    how: tuple[list[str], dict[str, str]], root: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    prefix, env = how
    return warm.run(
        [*prefix, *roots.CLI[1:], *args, "--root", str(root)],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_upkeep_on_another_users_root_is_one_line(
    other_user: tuple[list[str], dict[str, str]],
    shared_tmp: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = made_roots.made_root(tmp_path_factory, shared_tmp / "root")  # agent create's root
    root.chmod(0o755)  # its listing open to others: the files inside stay private
    for args in UPKEEP:
        proc = _as(other_user, root, *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        line = one_line(proc)
        assert "belongs to uid 0" in line and "run the command as uid 0" in line, (args, line)


@pytest.mark.skipif(
    why_not_available() is not None, reason=f"no child that modes apply to: {why_not_available()}"
)
@pytest.mark.parametrize("shut", ["agents", "daemon.lock"])
def test_upkeep_on_an_unreadable_part_of_ones_own_root_is_one_line(
    tmp_path: Path, shut: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = made_roots.made_root(tmp_path_factory, tmp_path / "root")  # agent create's root
    target = root / shut
    mode = target.stat().st_mode & 0o777
    target.chmod(0o000)
    try:
        for args in UPKEEP:
            if shut == "agents" and args[0] == "daemon":
                continue  # they read only the lock
            if shut == "daemon.lock" and args[-1] == "--dry-run":
                continue  # they do not look at the lock: they work
            proc = roots.cli(root, *args, as_json=False, preexec=unprivileged())
            assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
            line = one_line(proc)
            assert str(target) in line and "chmod" in line, (args, line)
    finally:
        target.chmod(mode)
    assert roots.cli(root, "fsck").returncode == 0


def test_the_cli_against_another_users_daemon_says_so(
    other_user: tuple[list[str], dict[str, str]], shared_tmp: Path
) -> None:
    theirs = shared_tmp / "theirs"
    theirs.mkdir(mode=0o700)
    shutil.chown(theirs, OTHER_UID, OTHER_UID)
    root = theirs / "root"
    made = _as(other_user, root, "agent", "create", "a1")
    assert made.returncode == 0, made.stderr
    try:
        for args in [("agent", "list"), ("daemon", "status"), ("agent", "send", "a1", "hi")]:
            proc = roots.cli(root, *args, as_json=False)
            assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
            line = one_line(proc)
            assert f"belongs to uid {OTHER_UID}" in line and "refuses others" in line, line
            assert "closed the connection" not in line and "daemon start" not in line, line
        # Through the library, past the CLI's check of the root: refused, never "died".
        for _ in range(5):
            with pytest.raises((RootPermissionError, RpcError)) as refused:
                with Client(root) as client:
                    client.call("agent.list")
            assert not isinstance(refused.value, DaemonDiedError)
            if isinstance(refused.value, RpcError):
                assert refused.value.code == protocol.PERMISSION_DENIED
            else:
                assert f"runs as uid {OTHER_UID}" in str(refused.value)
                assert "refuses other users" in str(refused.value)
        assert _as(other_user, root, "agent", "list").returncode == 0, "its owner is served"
    finally:
        with contextlib.suppress(Exception):
            _as(other_user, root, "daemon", "stop")


def test_another_users_private_root_says_whose_it_is(
    other_user: tuple[list[str], dict[str, str]],
    shared_tmp: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A root as substrat leaves it (0700, not listable by others): every command still
    says whose root it is, not only "listing it failed: permission denied"."""
    root = made_roots.made_root(tmp_path_factory, shared_tmp / "root")  # agent create's root
    assert root.stat().st_mode & 0o777 == 0o700
    for args in [*UPKEEP, ("agent", "list"), ("daemon", "start"), ("agent", "create", "x")]:
        proc = _as(other_user, root, *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        line = one_line(proc)
        assert "belongs to uid 0" in line and "permission denied" not in line, (args, line)
    assert sorted(p.name for p in (root / "agents").iterdir()), "nothing was made or taken"


def test_a_dangling_symlink_as_the_root_says_where_it_points(tmp_path: Path) -> None:
    """`ln -s /data/substrat ~/.substrat` before /data/substrat exists: the line says it
    is a symlink to nothing and what to do, not "creating it failed: File exists"; a link
    another user made is named as theirs and its target is not suggested."""
    target = tmp_path / "data" / "substrat"
    link = tmp_path / "home-substrat"
    link.symlink_to(target)
    proc = roots.cli(link, "daemon", "start", as_json=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = one_line(proc)
    assert f"symlink to {target}, which does not exist" in line, line
    assert f"mkdir -m 700 {target}" in line and "File exists" not in line, line
    os.lchown(link, OTHER_UID, OTHER_UID)
    planted = one_line(roots.cli(link, "agent", "create", "lead", as_json=False))
    assert f"made by uid {OTHER_UID}" in planted and "mkdir" not in planted, planted
    assert not target.exists() and not target.parent.exists()
