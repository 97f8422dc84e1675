"""The shared corpus: local directory always, Redis too when HYPOTHESIS_REDIS_URL is set.

The sharing test starts its own redis-server on a loopback port and runs two
"workers" (separate pytest processes, each in a fresh directory with its own
empty .hypothesis/). A failure found by the first must be the very first
example the second one tries.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis.database import DirectoryBasedExampleDatabase, MultiplexedDatabase

from oracle.corpus import (
    LOCAL_EXAMPLES_DIR,
    REDIS_URL_ENV,
    CorpusConfigError,
    example_database,
    redact_url,
    redis_database,
    redis_url_from_env,
    validate_redis_url,
)
from tests.support.unused_plugins import PYTEST_ARGS

REDIS_START_TIMEOUT_S = 10.0
WORKER_TIMEOUT_S = 120.0
FAILS_FROM = 123_456

PROBE_TEST = f"""
import os

from hypothesis import given, strategies as st


@given(st.integers(min_value=0, max_value=10**9))
def test_probe(n):
    with open(os.environ["CORPUS_PROBE_LOG"], "a") as log:
        log.write(f"{{n}}\\n")
    assert n < {FAILS_FROM}
"""

# -- configuration, no server needed ---------------------------------------------


def test_no_url_means_the_local_directory_only() -> None:
    for environ in ({}, {REDIS_URL_ENV: ""}, {REDIS_URL_ENV: "   "}):
        assert redis_url_from_env(environ) is None
        db = example_database(environ)
        assert isinstance(db, DirectoryBasedExampleDatabase)
        assert Path(db.path) == LOCAL_EXAMPLES_DIR == Path(".hypothesis/examples")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("localhost:6379", "scheme"),
        ("http://127.0.0.1:6379/0", "scheme 'http'"),
        ("redis://127.0.0.1:notaport/0", "malformed"),
        ("redis://127.0.0.1:99999/0", "malformed"),
        ("redis:///0", "names no host"),
        ("redis://127.0.0.1:0/0", "port 0"),
        ("redis://127.0.0.1:6379/zero", "must be a number"),
        ("unix://", "no socket path"),
    ],
)
def test_malformed_urls_get_a_clear_error(url: str, message: str) -> None:
    with pytest.raises(CorpusConfigError, match=message) as info:
        example_database({REDIS_URL_ENV: url})
    assert REDIS_URL_ENV in str(info.value)
    assert "unset it" in str(info.value)


def test_passwords_never_reach_error_messages() -> None:
    assert redact_url("redis://user:s3cret@host:6379/0") == "redis://user:***@host:6379/0"
    with pytest.raises(CorpusConfigError) as info:
        validate_redis_url("http://user:s3cret@host:6379/0")
    assert "s3cret" not in str(info.value)


def test_missing_redis_package_gets_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes the import fail as if the package were absent.
    monkeypatch.setitem(sys.modules, "redis", None)
    monkeypatch.delitem(sys.modules, "hypothesis.extra.redis", raising=False)
    with pytest.raises(CorpusConfigError, match=r"pip install 'substrat\[redis\]'"):
        example_database({REDIS_URL_ENV: "redis://127.0.0.1:6379/0"})


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_an_unreachable_server_is_one_clear_error() -> None:
    url = f"redis://127.0.0.1:{_free_port()}/0"
    with pytest.raises(CorpusConfigError, match="no Redis answered"):
        redis_database(url, connect_timeout_s=2.0)


def _worker_env(workdir: Path, redis_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYPOTHESIS_"))}
    env.update(
        {
            "HYPOTHESIS_PROFILE": "default",
            REDIS_URL_ENV: redis_url,
            "CORPUS_PROBE_LOG": str(workdir / "tried.txt"),
            # Only our plugin: the worker must not depend on what else is installed.
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        }
    )
    return env


def _run_worker(workdir: Path, redis_url: str) -> subprocess.CompletedProcess[str]:
    workdir.mkdir()
    (workdir / "test_probe.py").write_text(PROBE_TEST)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "oracle.pytest_plugin", "-p", "no:cacheprovider"]
        # without the plugins the probe does not use, nor the import of every project module
        # (its assertions are about the corpus: replayed first, shrunk to FAILS_FROM)
        + [*PYTEST_ARGS, "-q", "test_probe.py"],
        cwd=workdir,
        env=_worker_env(workdir, redis_url),
        capture_output=True,
        text=True,
        timeout=WORKER_TIMEOUT_S,
    )


def test_a_malformed_url_stops_a_pytest_run_with_the_reason(tmp_path: Path) -> None:
    result = _run_worker(tmp_path / "w", "redis://127.0.0.1:notaport/0")
    assert result.returncode != 0
    assert "HYPOTHESIS_REDIS_URL='redis://127.0.0.1:notaport/0' is malformed" in (
        result.stdout + result.stderr
    )
    assert not (tmp_path / "w" / "tried.txt").exists()


# -- against a real redis-server -------------------------------------------------


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip(
            "redis-server is not installed; install it (Debian: apt-get install redis-server) "
            "to test the shared corpus"
        )
    port = _free_port()
    data_dir = tmp_path / "redis-data"
    data_dir.mkdir()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        + ["--dir", str(data_dir), "--daemonize", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + REDIS_START_TIMEOUT_S
        while True:
            try:
                redis_database(url, connect_timeout_s=0.5)
                break
            except CorpusConfigError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not start on port {port}")
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _tried(workdir: Path) -> list[int]:
    return [int(line) for line in (workdir / "tried.txt").read_text().split()]


def test_with_a_url_the_database_writes_to_both_places(redis_url: str) -> None:
    db = example_database({REDIS_URL_ENV: redis_url})
    assert isinstance(db, MultiplexedDatabase)
    redis_only = redis_database(redis_url)
    db.save(b"key", b"value")
    assert list(redis_only.fetch(b"key")) == [b"value"]


def test_a_failure_found_by_one_worker_is_replayed_first_by_another(
    redis_url: str, tmp_path: Path
) -> None:
    first = _run_worker(tmp_path / "worker1", redis_url)
    assert first.returncode == 1, first.stdout + first.stderr
    assert f"n={FAILS_FROM}" in first.stdout  # the shrunk falsifying example
    found = _tried(tmp_path / "worker1")
    assert found[-1] == FAILS_FROM  # Hypothesis re-runs the minimal failure last

    second = _run_worker(tmp_path / "worker2", redis_url)
    assert second.returncode == 1, second.stdout + second.stderr
    assert _tried(tmp_path / "worker2")[0] == FAILS_FROM

    # Control: a third fresh worker without the shared corpus does not start there.
    alone = _run_worker(tmp_path / "worker3", "")
    assert alone.returncode == 1, alone.stdout + alone.stderr
    assert _tried(tmp_path / "worker3")[0] != FAILS_FROM
