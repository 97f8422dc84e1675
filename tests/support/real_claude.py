"""The real Claude Code CLI, installed from the npm registry for the tests that need no login.

``claude_binary()`` installs ``@anthropic-ai/claude-code`` once into a cache
directory (``$SUBSTRAT_TEST_CACHE``, else ``$XDG_CACHE_HOME/substrat-tests``,
else ``~/.cache/substrat-tests``) and reuses it afterwards, so only the first
run pays for the download. The install is time-boxed, serialised between
pytest-xdist workers with a file lock, and a failed one is remembered for an
hour so an offline machine does not retry it on every run. When npm is
absent or the install fails, the caller skips with the reason.

The CLI runs with ``HOME`` pointed at a fresh directory and no Anthropic
credentials in its environment: not logged in, whatever the machine has.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

PACKAGE = "@anthropic-ai/claude-code"
INSTALL_TIMEOUT_S = 180
VERSION_TIMEOUT_S = 60
RETRY_AFTER_FAILURE_S = 3600
CREDENTIALS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")


class Unavailable(Exception):
    """Why the real CLI cannot be had here (the tests skip with this reason)."""


def cache_dir() -> Path:
    base = os.environ.get("SUBSTRAT_TEST_CACHE")
    if base:
        return Path(base) / "claude-code"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "substrat-tests" / "claude-code"


def claude_binary() -> Path:
    """The installed ``claude`` (installing it first if needed); Unavailable if it cannot be."""
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable(f"npm is not on PATH, so {PACKAGE} cannot be installed for this test")
    where = cache_dir()
    where.mkdir(parents=True, exist_ok=True)
    binary = where / "node_modules" / ".bin" / "claude"
    failed = where / "install-failed.txt"
    with open(where / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one xdist worker installs, the others wait
        if _works(binary):
            return binary
        if failed.exists() and time.time() - failed.stat().st_mtime < RETRY_AFTER_FAILURE_S:
            raise Unavailable(f"{PACKAGE} failed to install recently: {failed.read_text()}")
        command = [npm, "install", "--prefix", str(where), "--no-audit", "--no-fund"]
        command += ["--no-save", "--fetch-retries=1", "--fetch-timeout=60000", PACKAGE]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
            )
            problem = None if done.returncode == 0 else done.stderr.strip()[-500:]
        except subprocess.TimeoutExpired:
            problem = f"npm install took over {INSTALL_TIMEOUT_S} s"
        if problem is None and not _works(binary):
            problem = f"npm installed {PACKAGE} but {binary} does not run"
        if problem is not None:
            failed.write_text(problem)
            raise Unavailable(f"npm install {PACKAGE} failed: {problem}")
        failed.unlink(missing_ok=True)
        return binary


def _works(binary: Path) -> bool:
    if not binary.exists():
        return False
    with tempfile.TemporaryDirectory(prefix="claude-home-") as home:
        try:
            done = subprocess.run(
                [str(binary), "--version"],
                capture_output=True,
                text=True,
                timeout=VERSION_TIMEOUT_S,
                env=logged_out_env(Path(home)),
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
    return done.returncode == 0 and "Claude Code" in done.stdout


def logged_out_env(home: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment where the CLI is not logged in and stays quiet on the network."""
    env = dict(os.environ if base is None else base)
    for name in CREDENTIALS:
        env.pop(name, None)
    env["HOME"] = str(home)
    env["DISABLE_AUTOUPDATER"] = "1"
    env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
    return env
