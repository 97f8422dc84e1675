"""The benchmark's daemons start with bytecode, as a deployed daemon does."""

from __future__ import annotations

from pathlib import Path

import pytest

from oracle import bench_scale
from oracle.bench_scale import ScaleRoot, daemon_cold_start, daemon_environment


@pytest.fixture
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setattr(bench_scale, "_bytecode_prefix", None)
    monkeypatch.setattr(bench_scale, "_warmed", set())
    return monkeypatch


def test_bytecode_off_gets_a_cache_of_its_own(fresh_cache: pytest.MonkeyPatch) -> None:
    fresh_cache.setenv("PYTHONDONTWRITEBYTECODE", "1")
    fresh_cache.delenv("PYTHONPYCACHEPREFIX", raising=False)
    env = daemon_environment()
    assert "PYTHONDONTWRITEBYTECODE" not in env
    prefix = Path(env["PYTHONPYCACHEPREFIX"])
    assert prefix.is_dir()
    assert daemon_environment()["PYTHONPYCACHEPREFIX"] == str(prefix)  # one cache per run


@pytest.mark.parametrize(
    ("dont_write", "prefix"), [("1", "/somewhere/of/the/user"), (None, None), (None, "/user")]
)
def test_what_the_user_set_is_kept(
    fresh_cache: pytest.MonkeyPatch, dont_write: str | None, prefix: str | None
) -> None:
    for name, value in (("PYTHONDONTWRITEBYTECODE", dont_write), ("PYTHONPYCACHEPREFIX", prefix)):
        if value is None:
            fresh_cache.delenv(name, raising=False)
        else:
            fresh_cache.setenv(name, value)
    env = daemon_environment()
    assert env.get("PYTHONDONTWRITEBYTECODE") == dont_write
    assert env.get("PYTHONPYCACHEPREFIX") == prefix


def test_a_measured_start_finds_substrat_compiled(
    fresh_cache: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fresh_cache.setenv("PYTHONDONTWRITEBYTECODE", "1")
    fresh_cache.delenv("PYTHONPYCACHEPREFIX", raising=False)
    root = ScaleRoot(tmp_path / "root", 0, 0, 0)
    root.path.mkdir(mode=0o700)
    result = daemon_cold_start(root)
    assert result.agents == 0
    prefix = Path(daemon_environment()["PYTHONPYCACHEPREFIX"])
    compiled = {path.name.split(".")[0] for path in prefix.rglob("*.pyc")}
    # the warm-up imported every module, not only those an empty start needs
    assert {"daemon", "orchestrator", "recovery", "compaction", "fsck"} <= compiled
    assert len(bench_scale._warmed) == 1
