"""`-n auto`'s worker count, and `-n N` handing tests out by work stealing unless `--dist`
says otherwise (tests/conftest.py)."""

from __future__ import annotations

import dataclasses

import pytest
from xdist.scheduler import WorkStealingScheduling

from tests.conftest import (
    auto_workers,
    pytest_xdist_auto_num_workers,
    pytest_xdist_make_scheduler,
    usable_cpus,
)


@pytest.fixture
def n2(pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch) -> pytest.Config:
    """This run's config as ``pytest -n 2`` (no ``--dist``) would have it."""
    monkeypatch.setattr(pytestconfig.option, "dist", "load")
    monkeypatch.setattr(pytestconfig.option, "tx", ["popen", "popen"])
    monkeypatch.setattr(pytestconfig.option, "numprocesses", 2)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    params = dataclasses.replace(pytestconfig.invocation_params, args=("-n", "2"))
    monkeypatch.setattr(pytestconfig, "invocation_params", params)
    return pytestconfig


def test_n_without_dist_steals_work(n2: pytest.Config) -> None:
    assert isinstance(pytest_xdist_make_scheduler(n2, None), WorkStealingScheduling)


@pytest.mark.parametrize("how", [("--dist", "load"), ("--dist=load",)])
def test_an_explicit_dist_is_left_to_xdist(
    n2: pytest.Config, monkeypatch: pytest.MonkeyPatch, how: tuple[str, ...]
) -> None:
    params = dataclasses.replace(n2.invocation_params, args=("-n", "2", *how))
    monkeypatch.setattr(n2, "invocation_params", params)
    assert pytest_xdist_make_scheduler(n2, None) is None
    monkeypatch.setattr(n2, "invocation_params", dataclasses.replace(params, args=("-n", "2")))
    monkeypatch.setenv("PYTEST_ADDOPTS", " ".join(how))
    assert pytest_xdist_make_scheduler(n2, None) is None


def test_other_modes_are_left_to_xdist(n2: pytest.Config, monkeypatch: pytest.MonkeyPatch) -> None:
    for mode in ("loadfile", "loadscope", "each", "no"):
        monkeypatch.setattr(n2.option, "dist", mode)
        assert pytest_xdist_make_scheduler(n2, None) is None


@pytest.mark.parametrize(("cpus", "workers"), [(1, 2), (2, 3), (4, 5), (8, 10), (64, 80)])
def test_auto_adds_a_quarter_more_workers_than_cpus_and_at_least_one(
    cpus: int, workers: int
) -> None:
    assert auto_workers(cpus) == workers


def test_auto_is_ours_through_xdist_s_hook(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(pytestconfig.option, "numprocesses", "auto")
    hook = pytestconfig.hook.pytest_xdist_auto_num_workers
    assert hook(config=pytestconfig) == auto_workers(usable_cpus())


def test_the_variable_and_logical_are_left_to_xdist(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = pytestconfig.hook.pytest_xdist_auto_num_workers
    monkeypatch.setattr(pytestconfig.option, "numprocesses", "auto")
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "7")
    assert hook(config=pytestconfig) == 7
    assert pytest_xdist_auto_num_workers(pytestconfig) is None
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS")
    assert pytest_xdist_auto_num_workers(pytestconfig) == auto_workers(usable_cpus())
    monkeypatch.setattr(pytestconfig.option, "numprocesses", "logical")
    assert pytest_xdist_auto_num_workers(pytestconfig) is None
