"""The root rules (docs/daemon.md, "Which directory is a root"), through the real CLI.

Substrat never changes the mode or the contents of a directory it did not
create; commands that only read never create a root or start a daemon; a root
that cannot be used gets one line and exit status 2 from every command,
including the daemon process itself. The directories are real: a shared
mode-1777 directory, a read-only tmpfs, an immutable directory, a directory
its owner cannot write (with root's DAC override dropped).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.rpc import lock
from tests.support import made_roots, mounts, warm
from tests.support.cli import NOT_INSTALLED, SUBSTRAT, stop_or_kill

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason=NOT_INSTALLED)

MARKER_NAME = "substrat-root.json"  # docs/daemon.md names it
MARKER_VERSION = 2
READING = [
    ("agent", "list"),
    ("agent", "tree"),
    ("agent", "show", "lead"),
    ("inbox",),
    ("log", "lead"),
    ("watch", "--count", "1"),
    ("fsck",),
    ("recover", "--dry-run"),
    ("daemon", "status"),
]
"""Commands that only read: never a root or a daemon where there is no root."""
WRITING_IN_A_ROOT = [
    ("agent", "send", "lead", "hi"),
    ("agent", "rm", "lead"),
    ("inbox", "--collect"),
    ("fsck", "--repair"),
    ("recover",),
    ("daemon", "stop"),
]
"""Commands that change a root but need one to exist already."""
CREATING = [
    ("daemon", "start"),
    ("daemon", "start", "--foreground"),
    ("daemon", "restart"),
    ("agent", "create", "lead"),
]
DAEMON = ("<daemon>",)
"""``python -m substrat.daemon --root R``: the daemon process itself."""


_TOUCHED: list[Path] = []


@pytest.fixture(autouse=True)
def _no_daemon_left_behind() -> Iterator[None]:
    """Whatever a test did (or the code under test wrongly did), no daemon outlives it."""
    yield
    while _TOUCHED:
        root = _TOUCHED.pop()
        with contextlib.suppress(OSError):
            stop_or_kill(root)


def run(
    root: Path,
    *args: str,
    via_env: bool = True,
    timeout_s: float = 60,
    prefix: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it: the root by SUBSTRAT_HOME, or by --root."""
    _TOUCHED.append(root)
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("SUBSTRAT_NO_AUTOSTART", None)
    if args == DAEMON:
        command = [sys.executable, "-m", "substrat.daemon", "--root", str(root)]
    elif via_env:
        env["SUBSTRAT_HOME"] = str(root)
        command = [SUBSTRAT, *args]
    else:
        env.pop("SUBSTRAT_HOME", None)
        command = [SUBSTRAT, *args, "--root", str(root)]
    return warm.run([*prefix, *command], capture_output=True, text=True, timeout=timeout_s, env=env)


def snapshot(path: Path) -> dict[str, tuple[int, str]]:
    """Every entry under ``path`` (and ``path`` itself): mode and content hash."""
    found: dict[str, tuple[int, str]] = {}
    for current, dirs, files in os.walk(path):
        for name in [".", *dirs, *files]:
            full = Path(current, name)
            info = os.lstat(full)
            digest = (
                hashlib.sha256(full.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else ""
            )
            found[os.path.relpath(full, path)] = (info.st_mode, digest)
    return found


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture
def made_root(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A root made by ``agent create``, its daemon stopped (a copy of one made once:
    tests/support/made_roots)."""
    root = made_roots.made_root(tmp_path_factory, tmp_path / "root")
    yield root
    stop_or_kill(root)


def test_a_shared_directory_is_refused_and_left_untouched(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "someone-elses.txt").write_text("keep me")
    before = snapshot(shared)
    for index, args in enumerate([*READING, *WRITING_IN_A_ROOT, *CREATING, DAEMON]):
        proc = run(shared, *args, via_env=index % 2 == 0)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        line = one_line(proc)
        assert f"{shared} is not a substrat root and not empty" in line, args
        assert "someone-elses.txt" in line and "never writes into a directory" in line
        assert snapshot(shared) == before, args
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_commands_that_need_a_root_never_create_one(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "nothing"
    if kind == "empty":
        path.mkdir(mode=0o700)
    for index, args in enumerate([*READING, *WRITING_IN_A_ROOT]):
        proc = run(path, *args, via_env=index % 2 == 0)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert f"no substrat root at {path}" in one_line(proc), args
        if kind == "missing":
            assert not path.exists(), args
        else:
            assert os.listdir(path) == [], args
    assert not lock.is_held(path)


def test_an_empty_directory_is_adopted_only_if_already_private(tmp_path: Path) -> None:
    path = tmp_path / "mine"
    path.mkdir()
    os.chmod(path, 0o755)
    try:
        # A reading command's hint says what the creating ones will need first.
        hinted = one_line(run(path, "agent", "list"))
        assert "readable by others, mode 0755" in hinted
        assert f"`chmod 700 {path}`, then `substrat daemon start --root {path}`" in hinted
        for args in CREATING:
            refused = run(path, *args)
            assert refused.returncode == 2, (args, refused.stderr)
            assert f"run `chmod 700 {path}`" in one_line(refused)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o755 and os.listdir(path) == []
        os.chmod(path, 0o700)
        created = run(path, "agent", "create", "lead")
        assert created.returncode == 0, created.stderr
        marker = json.loads((path / MARKER_NAME).read_text())
        assert marker["format"] == "substrat-root" and marker["version"] == MARKER_VERSION
        listed = run(path, "agent", "list", "--json")
        assert [a["path"] for a in json.loads(listed.stdout)] == ["lead"]
    finally:
        stop_or_kill(path)


def test_a_root_from_before_the_marker_is_accepted_and_upgraded(made_root: Path) -> None:
    (made_root / MARKER_NAME).unlink(missing_ok=True)  # a root made by an older substrat
    checked = run(made_root, "fsck")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert not (made_root / MARKER_NAME).exists()  # reading writes nothing
    listed = run(made_root, "agent", "list", "--json")  # starts the daemon: a writer
    assert listed.returncode == 0, listed.stderr
    assert [a["path"] for a in json.loads(listed.stdout)] == ["lead"]
    assert json.loads((made_root / MARKER_NAME).read_text())["version"] == MARKER_VERSION
    stop_or_kill(made_root)
    clean = run(made_root, "fsck", "--json")
    assert clean.returncode == 0 and json.loads(clean.stdout)["findings"] == []


def test_a_directory_that_only_looks_like_an_old_root_is_refused(
    made_root: Path, tmp_path: Path
) -> None:
    (made_root / MARKER_NAME).unlink(missing_ok=True)
    (made_root / "notes.txt").write_text("not substrat's")
    proc = run(made_root, "agent", "list")
    assert proc.returncode == 2 and "it holds notes.txt" in one_line(proc)
    project = tmp_path / "project"  # a project's own agents/ directory, no session in it
    (project / "agents").mkdir(parents=True)
    (project / "agents" / "my_agent.py").write_text("# not a session")
    before = snapshot(project)
    proc = run(project, "daemon", "start")
    assert proc.returncode == 2 and "it holds agents, and no substrat-root.json" in one_line(proc)
    assert snapshot(project) == before


def test_a_shared_directory_with_only_an_empty_agents_dir_is_not_chmodded(tmp_path: Path) -> None:
    # An old root before its first agent looks like this, and so may a project's scaffold:
    # adopted as an empty directory is, only if already private; its mode is never changed.
    path = tmp_path / "scaffold"
    (path / "agents").mkdir(parents=True)
    os.chmod(path, 0o755)
    try:
        refused = run(path, "daemon", "start")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "holds only an empty agents/" in one_line(refused)
        assert f"run `chmod 700 {path}`" in one_line(refused)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o755
        assert sorted(os.listdir(path)) == ["agents"]
        os.chmod(path, 0o700)
        started = run(path, "daemon", "start")
        assert started.returncode == 0, started.stderr
        assert (path / MARKER_NAME).exists()
    finally:
        stop_or_kill(path)


# -- unusable roots -------------------------------------------------------------------------

UNUSABLE_COMMANDS = [
    ("daemon", "start"),
    ("daemon", "start", "--foreground"),
    ("agent", "create", "other"),
    ("agent", "list"),
    ("fsck", "--repair"),
    ("compact",),
    ("recover",),
    DAEMON,
]


def _check_unusable(root: Path, expected: str, prefix: tuple[str, ...] = ()) -> None:
    before = snapshot(root) if root.is_dir() and os.access(root, os.R_OK | os.X_OK) else None
    for index, args in enumerate(UNUSABLE_COMMANDS):
        proc = run(root, *args, via_env=index % 2 == 0, prefix=prefix)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        line = one_line(proc)
        assert str(root) in line and expected in line, (args, line)
        if before is not None:
            assert snapshot(root) == before, args


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounts.tmpfs(tmp_path / "mnt", "4m", "to make read-only") as mount_point:
        yield mount_point


def test_a_root_on_a_read_only_file_system(
    tmpfs: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = made_roots.made_root(tmp_path_factory, tmpfs / "root")  # agent create's root
    deadline = time.monotonic() + 20
    while True:  # busy until nothing holds a file open for writing there
        remount = subprocess.run(
            ["mount", "-o", "remount,ro", str(tmpfs)], capture_output=True, text=True
        )
        if remount.returncode == 0:
            break
        assert time.monotonic() < deadline, remount.stderr
        time.sleep(0.1)
    _check_unusable(root, "read-only file system")
    # the data is on that mount: remounting is the fix, not another directory
    _check_unusable(root, "remount its file system read-write")
    # Reading a read-only root (a snapshot, a backup mount) works, and blames no agent:
    # the whole root is read-only, once, not every agent "Permission denied".
    reading = run(root, "recover", "--dry-run")
    assert reading.returncode == 0, reading.stdout + reading.stderr
    assert "read-only file system" in reading.stdout, reading.stdout
    assert "unreadable" not in reading.stdout and "held back" not in reading.stdout
    checked = run(root, "fsck", "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    kinds = [f["kind"] for f in json.loads(checked.stdout)["findings"]]
    assert "read_only_root" in kinds and "unreadable" not in kinds, kinds


def test_an_immutable_root(made_root: Path) -> None:
    if subprocess.run(["chattr", "+i", str(made_root)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here (needs CAP_LINUX_IMMUTABLE and ext4/xfs)")
    try:
        _check_unusable(made_root, "immutable")
    finally:
        subprocess.run(["chattr", "-i", str(made_root)], check=True)


def test_a_root_its_owner_cannot_write(made_root: Path) -> None:
    """Mode 0500, as its owner sees it: root's DAC override is dropped for the commands."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is missing: cannot drop root's DAC override")
    drop = (setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--")
    probe = subprocess.run([*drop, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot drop capabilities here: {probe.stderr.strip()}")
    os.chmod(made_root, 0o500)
    try:
        _check_unusable(made_root, "chmod 700", prefix=drop)
    finally:
        os.chmod(made_root, 0o700)


@pytest.mark.parametrize("kind", ["file", "under_a_file"])
def test_a_root_path_that_is_not_a_directory(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "plain-file"
    target.write_text("x")
    root = target if kind == "file" else target / "root"
    expected = "not a directory"
    _check_unusable(root, expected)
    for args in READING if kind == "file" else []:
        proc = run(root, *args)
        assert proc.returncode == 2 and expected in one_line(proc), args
    assert target.read_text() == "x"


def test_a_shared_directory_with_a_socket_in_it_is_not_contacted(tmp_path: Path) -> None:
    """A foreign directory's ``daemon.sock`` is never connected to (it may be anyone's)."""
    import socket

    shared = tmp_path / "s"
    shared.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.closing(listener):
        listener.bind(str(shared / "daemon.sock"))
        listener.listen(1)
        listener.settimeout(0.1)
        (shared / "data.bin").write_bytes(b"\0")
        for args in [("agent", "list"), ("daemon", "status"), ("daemon", "stop")]:
            proc = run(shared, *args)
            assert proc.returncode == 2 and "not a substrat root" in one_line(proc)
        with pytest.raises(TimeoutError):
            listener.accept()
