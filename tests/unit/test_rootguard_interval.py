"""How often the daemon's root guard looks between answers (substrat/rootguard.py,
``SUBSTRAT_ROOT_CHECK_S``; docs/daemon.md, "A root moved while its daemon runs").

The guard's check before every answer does not depend on the interval; it only says how
soon a daemon nobody talks to notices that its root went away. Tests that wait for that
set it low; a bad value stops the daemon's start with a message saying what to set.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from substrat import daemon, rootguard
from substrat.rootguard import CHECK_ENV, CHECK_EVERY_S, RootGuard, check_every_s


def test_unset_or_empty_keeps_the_default() -> None:
    assert check_every_s({}) == CHECK_EVERY_S == 1.0
    assert check_every_s({CHECK_ENV: " "}) == CHECK_EVERY_S


@pytest.mark.parametrize(("text", "seconds"), [("0.05", 0.05), ("0.01", 0.01), ("60", 60.0)])
def test_a_number_in_range_is_the_interval(text: str, seconds: float) -> None:
    assert check_every_s({CHECK_ENV: text}) == seconds


@pytest.mark.parametrize("text", ["abc", "0", "-1", "0.001", "61", "nan", "inf"])
def test_anything_else_is_refused_saying_what_to_set(text: str) -> None:
    with pytest.raises(ValueError) as refused:
        check_every_s({CHECK_ENV: text})
    said = str(refused.value)
    assert CHECK_ENV in said and repr(text) in said
    assert "from 0.01 to 60" in said and "unset it for the default (1 s)" in said


def test_the_daemon_takes_the_interval_from_its_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(CHECK_ENV, raising=False)
    assert daemon.parse_args(["--root", str(tmp_path)]).root_check_s == CHECK_EVERY_S
    monkeypatch.setenv(CHECK_ENV, "0.05")
    assert daemon.parse_args(["--root", str(tmp_path)]).root_check_s == 0.05


def test_a_bad_interval_stops_the_start_before_the_root_is_touched(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CHECK_ENV, "soon")
    root = tmp_path / "root"
    assert daemon.main(["--root", str(root)]) == daemon.EXIT_USAGE
    assert f"{CHECK_ENV}='soon' is not a number of seconds" in capsys.readouterr().err
    assert not root.exists()


def test_the_watch_sleeps_the_interval_it_is_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    slept: list[float] = []
    looked: list[None] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            raise asyncio.CancelledError

    monkeypatch.setattr(rootguard.asyncio, "sleep", sleep)
    guard = RootGuard(tmp_path)
    monkeypatch.setattr(guard, "enforce", lambda: looked.append(None))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(guard.watch(0.05))
    assert slept == [0.05, 0.05, 0.05] and len(looked) == 2
