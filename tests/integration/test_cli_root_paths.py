"""A root path that cannot work, and a root made by a command that is not asked to make
one, through the real CLI (docs/daemon.md, "Which directory is a root").

A root path too long for the daemon's lock record is refused before anything is made,
and a root an older version half-made there gets one line saying what to do; a command
that makes a new root says so (``created a new root at PATH``), and ``agent create``
checks its arguments before it makes one.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.rootdir import MAX_ROOT_PATH_CHARS
from substrat.rpc import lock
from tests.support import warm
from tests.support.cli import NOT_INSTALLED, SUBSTRAT, stop_all, stop_or_kill

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason=NOT_INSTALLED)
_TOUCHED: list[Path] = []


@pytest.fixture(autouse=True)
def _no_daemon_left_behind() -> Iterator[None]:
    yield
    stop_all(_TOUCHED)


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    _TOUCHED.append(root)
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("SUBSTRAT_NO_AUTOSTART", None)
    env.pop("SUBSTRAT_HOME", None)
    return warm.run(
        [SUBSTRAT, *args, "--root", str(root)], capture_output=True, text=True, timeout=60, env=env
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def long_path(base: Path, chars: int, last: str = "e") -> Path:
    """A path under ``base`` that takes ``chars`` characters in the lock record (a
    non-ASCII character counts as its JSON escape, 6), in components of at most 201.
    ``base`` is measured the same way: under a TMPDIR such as /tmp/é the path went
    over the limit when it counted the base's characters."""
    path = str(base)
    width = lock.record_chars(last)
    while chars - lock.record_chars(path) - 1 - width > 200:
        path += "/" + "d" * 200
    left = chars - lock.record_chars(path) - 1 - width
    assert 0 <= left <= 200
    return Path(path + "/" + "e" * left + last)


@pytest.mark.parametrize("last", ["e", "é"])
def test_long_path_measures_a_non_ascii_base_as_the_lock_record_does(
    tmp_path: Path, last: str
) -> None:
    base = tmp_path / "tmp ü" / "deep"  # a TMPDIR like this one failed the tests below
    for chars in (MAX_ROOT_PATH_CHARS, MAX_ROOT_PATH_CHARS + 1):
        assert lock.record_chars(long_path(base, chars, last)) == chars


CREATING = [("agent", "create", "lead"), ("daemon", "start"), ("daemon", "restart")]


@pytest.mark.parametrize("last", ["e", "é"])
def test_a_root_path_over_the_limit_is_refused_before_anything_is_made(
    tmp_path: Path, last: str
) -> None:
    path = long_path(tmp_path / "deep", MAX_ROOT_PATH_CHARS + 1, last)
    assert lock.record_chars(path) == MAX_ROOT_PATH_CHARS + 1
    for args in CREATING:
        line = one_line(refused := run(path, *args))
        assert refused.returncode == 2, args
        assert f"its path is {MAX_ROOT_PATH_CHARS + 1} characters long" in line
        assert f"over the limit of {MAX_ROOT_PATH_CHARS}" in line and "use a shorter --root" in line
        assert not (tmp_path / "deep").exists(), args  # nothing was made


@pytest.mark.parametrize("last", ["e", "é"])
def test_a_root_path_at_the_limit_works(tmp_path: Path, last: str) -> None:
    path = long_path(tmp_path / "deep", MAX_ROOT_PATH_CHARS, last)
    created = run(path, "agent", "create", "lead")
    assert created.returncode == 0, created.stderr
    sent = run(path, "agent", "send", "lead", "hello")
    assert sent.returncode == 0, sent.stderr
    info = lock.read_info(path)
    assert info is not None and info.state == "running" and info.socket is not None
    assert run(path, "daemon", "stop").returncode == 0
    assert run(path, "fsck").returncode == 0


def test_a_root_an_older_version_half_made_at_a_long_path_says_what_to_do(
    tmp_path: Path,
) -> None:
    path = long_path(tmp_path / "deep", MAX_ROOT_PATH_CHARS + 30)
    path.mkdir(parents=True, mode=0o700)
    # what an older version left: the marker, then an empty lock file (its record failed)
    (path / "substrat-root.json").write_text('{"format": "substrat-root", "version": 1}\n')
    (path / "daemon.lock").touch()
    before = sorted(os.listdir(path))
    for args in [("agent", "list"), *CREATING, ("fsck",), ("daemon", "status")]:
        line = one_line(refused := run(path, *args))
        assert refused.returncode == 2, args
        assert f"over the limit of {MAX_ROOT_PATH_CHARS}" in line, args
        assert "move the directory to a shorter path (`mv`; nothing in it is lost)" in line
        assert sorted(os.listdir(path)) == before and not lock.is_held(path)


def test_daemon_start_and_restart_say_when_they_made_a_new_root(tmp_path: Path) -> None:
    typo = tmp_path / "typo"
    started = run(typo, "daemon", "start")
    assert started.returncode == 0, started.stderr
    assert f"substrat: created a new root at {typo}" in started.stderr
    again = run(typo, "daemon", "start")
    assert again.returncode == 0 and "created" not in again.stderr
    restarted = run(typo, "daemon", "restart", "--json")
    assert json.loads(restarted.stdout)["created"] is False
    other = tmp_path / "other"
    made = run(other, "daemon", "restart")
    assert made.returncode == 0, made.stderr
    assert f"substrat: created a new root at {other}" in made.stderr and "a new root" in made.stdout
    as_json = run(tmp_path / "third", "daemon", "start", "--json")
    assert json.loads(as_json.stdout)["created"] is True and not as_json.stderr
    fourth = tmp_path / "fourth"
    _TOUCHED.append(fourth)
    env = {**os.environ}
    env.pop("SUBSTRAT_HOME", None)
    foreground = subprocess.Popen(
        [SUBSTRAT, "daemon", "start", "--foreground", "--root", str(fourth)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert foreground.stderr is not None
    try:
        first = foreground.stderr.readline()  # before the daemon's own log lines
        while "ready: listening" not in foreground.stderr.readline():
            assert foreground.poll() is None, "the daemon exited"
        stop_or_kill(fourth)
        foreground.communicate(timeout=60)
    finally:
        if foreground.poll() is None:
            foreground.kill()
            foreground.communicate()
    assert first.strip() == f"substrat: created a new root at {fourth}"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("bad name",), "invalid agent name 'bad name'"),
        (("user",), "'user' is reserved"),
        (("x", "--model", "zz"), "the scripted provider has one model"),
        (("x", "--provider", "paced", "--model", "soon"), "paced model 'soon' must be a pause"),
    ],
)
def test_agent_create_checks_its_arguments_before_it_makes_a_root(
    tmp_path: Path, args: tuple[str, ...], expected: str
) -> None:
    path = tmp_path / "new"
    line = one_line(refused := run(path, "agent", "create", *args))
    assert refused.returncode == 2 and expected in line
    assert not path.exists()  # no root, no daemon


def test_agent_create_checks_the_name_on_a_root_too(tmp_path: Path) -> None:
    path = tmp_path / "root"
    assert run(path, "daemon", "start").returncode == 0
    line = one_line(refused := run(path, "agent", "create", "bad name"))
    assert refused.returncode == 2 and "invalid agent name 'bad name'" in line
    assert "nothing was created" in line
