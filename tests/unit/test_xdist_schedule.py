"""`-n auto`'s worker count, and `-n N` handing tests out by work stealing unless `--dist`
says otherwise (tests/conftest.py)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
from xdist.scheduler import WorkStealingScheduling

from tests.conftest import (
    STEALS_WORK,
    auto_workers,
    every_cpu_by_default,
    long_items_first,
    pytest_cmdline_main,
    pytest_configure_node,
    pytest_xdist_auto_num_workers,
    pytest_xdist_make_scheduler,
    usable_cpus,
    worksteal_shares,
)
from tests.conftest import pytest_collection_modifyitems as conftest_modifyitems


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


@pytest.mark.parametrize(("count", "workers"), [(10, 3), (2065, 3), (7, 2), (5, 4)])
def test_the_shares_are_the_ones_work_stealing_hands_out(count: int, workers: int) -> None:
    class Node:
        shutting_down = False

        def __init__(self) -> None:
            self.sent: list[int] = []

        def send_runtest_some(self, indices: list[int]) -> None:
            self.sent += indices

        def shutdown(self) -> None:
            pass

    scheduler: Any = WorkStealingScheduling.__new__(WorkStealingScheduling)
    nodes = [Node() for _ in range(workers)]
    scheduler.node2pending = {node: [] for node in nodes}
    scheduler.pending = list(range(count))
    scheduler.steal_requested_from_node = None
    scheduler.check_schedule()
    assert [len(node.sent) for node in nodes] == worksteal_shares(count, workers)
    assert [i for node in nodes for i in node.sent] == list(range(count))  # consecutive runs


def is_stress(item: str) -> bool:
    return item[0] == "s"


def waits(item: str) -> bool:
    return item[0] == "w"


def test_each_share_starts_with_its_part_of_the_stress_items() -> None:
    # 3 workers, 12 items: s = stress, q = quick; shares of 4.
    items = ["q0", "q1", "q2", "q3", "q4", "q5", "s0", "q6", "s1", "s2", "s3", "s4"]
    ordered = long_items_first(items, 3, is_stress, waits)
    assert ordered == ["s0", "s3", "q0", "q1", "s1", "s4", "q2", "q3", "s2", "q4", "q5", "q6"]
    assert sorted(ordered) == sorted(items)


def test_the_workers_beyond_the_cpus_start_on_the_waiting_items_not_the_stress_ones() -> None:
    # 3 workers on 2 CPUs, 12 items, w = waits: the last share takes the waiting items
    # first, then the collection's end.
    items = ["q0", "w0", "q1", "q2", "q3", "s0", "w1", "q4", "s1", "s2", "s3", "s4"]
    ordered = long_items_first(items, 3, is_stress, waits, waiting_shares=1)
    assert ordered == ["s0", "s2", "s4", "q0", "s1", "s3", "q1", "q2", "w0", "w1", "q3", "q4"]
    # More waiting shares than a run can spare: one share still deals every stress item.
    ordered = long_items_first(items, 3, is_stress, waits, waiting_shares=5)
    assert ordered == ["s0", "s1", "s2", "s3", "s4", "w0", "q0", "q1", "q2", "w1", "q3", "q4"]


def test_without_workers_beyond_the_cpus_every_share_takes_waiting_items() -> None:
    items = ["w0", "q0", "q1", "s0", "w1", "q2", "s1", "q3"]
    ordered = long_items_first(items, 2, is_stress, waits)
    assert ordered == ["s0", "w0", "q0", "q1", "s1", "w1", "q2", "q3"]


def test_without_long_items_the_order_is_the_collection_s() -> None:
    items = ["q0", "q1", "q2"]
    assert long_items_first(items, 2, is_stress, waits) is items


def test_more_stress_than_a_share_holds_keeps_every_item() -> None:
    items = ["s0", "s1", "s2", "s3", "q0"]
    ordered = long_items_first(items, 2, is_stress, waits)
    assert ordered == ["s0", "s2", "s1", "s3", "q0"]


def _items(marks: dict[int, str], count: int) -> list[Any]:
    return [
        SimpleNamespace(
            nodeid=f"t{i}",
            get_closest_marker={marks[i]: getattr(pytest.mark, marks[i]).mark}.get
            if i in marks
            else {}.get,
        )
        for i in range(count)
    ]


def test_a_worker_that_steals_work_deals_the_long_items_out(
    monkeypatch: pytest.MonkeyPatch, n2: pytest.Config
) -> None:
    items = _items({4: "stress", 5: "stress", 1: "waits"}, 6)
    monkeypatch.setattr("tests.conftest.usable_cpus", lambda: 2)
    monkeypatch.setattr(n2.option, "run_stress", True, raising=False)
    cases = (
        (2, True, [4, 1, 0, 5, 2, 3]),
        (2, False, list(range(6))),
        (3, True, [4, 0, 5, 2, 1, 3]),  # the third worker: the waiting item first
    )
    for workers, steals, order in cases:
        workerinput = {"workercount": workers, STEALS_WORK: steals}
        monkeypatch.setattr(n2, "workerinput", workerinput, raising=False)
        got = list(items)
        conftest_modifyitems(n2, got)
        assert [i.nodeid for i in got] == [f"t{i}" for i in order]
    # Without --run-stress the stress items skip at once: only the waiting ones move.
    monkeypatch.setattr(n2.option, "run_stress", False, raising=False)
    got = list(items)
    conftest_modifyitems(n2, got)
    assert [i.nodeid for i in got] == [f"t{i}" for i in (0, 2, 3, 4, 1, 5)]


def test_the_controller_tells_its_workers_whether_they_steal_work(
    monkeypatch: pytest.MonkeyPatch, n2: pytest.Config
) -> None:
    def told() -> bool:
        node = SimpleNamespace(config=n2, workerinput={})
        pytest_configure_node(node)
        return bool(node.workerinput[STEALS_WORK])

    assert told()  # -n 2: ours
    monkeypatch.setattr(n2.option, "dist", "worksteal")
    assert told()
    for mode in ("loadfile", "loadscope", "each"):
        monkeypatch.setattr(n2.option, "dist", mode)
        assert not told()
    monkeypatch.setattr(n2.option, "dist", "load")
    params = dataclasses.replace(n2.invocation_params, args=("-n", "2", "--dist", "load"))
    monkeypatch.setattr(n2, "invocation_params", params)
    assert not told()  # load, as asked


@pytest.fixture
def bare(pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch) -> pytest.Config:
    """This run's config as the README's bare ``pytest`` would have it (no paths, no ``-n``)."""
    monkeypatch.setattr(pytestconfig, "args_source", pytest.Config.ArgsSource.TESTPATHS)
    monkeypatch.setattr(pytestconfig.option, "numprocesses", None)
    monkeypatch.setattr(pytestconfig.option, "dist", "no")
    for name in ("collectonly", "usepdb", "stepwise", "stepwise_skip"):
        monkeypatch.setattr(pytestconfig.option, name, False, raising=False)
    monkeypatch.setattr(pytestconfig.option, "capture", "fd")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    params = dataclasses.replace(pytestconfig.invocation_params, args=())
    monkeypatch.setattr(pytestconfig, "invocation_params", params)
    if hasattr(pytestconfig, "workerinput"):  # this test may itself run on an xdist worker
        monkeypatch.delattr(pytestconfig, "workerinput")
    return pytestconfig


def test_the_bare_default_run_uses_every_cpu(bare: pytest.Config) -> None:
    assert every_cpu_by_default(bare)
    pytest_cmdline_main(bare)
    assert bare.option.numprocesses == "auto"  # xdist's own hook turns it into a count


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("numprocesses", 0),  # -n 0
        ("numprocesses", 4),
        ("collectonly", True),
        ("usepdb", True),
        ("stepwise", True),
        ("capture", "no"),  # -s: live output
    ],
)
def test_a_run_that_asks_otherwise_stays_as_asked(
    bare: pytest.Config, monkeypatch: pytest.MonkeyPatch, option: str, value: object
) -> None:
    monkeypatch.setattr(bare.option, option, value, raising=False)
    assert not every_cpu_by_default(bare)
    pytest_cmdline_main(bare)
    assert bare.option.numprocesses == bare.getoption("numprocesses") != "auto"


def test_a_run_of_named_paths_or_with_a_dist_mode_stays_in_one_process(
    bare: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bare, "args_source", pytest.Config.ArgsSource.ARGS)
    assert not every_cpu_by_default(bare)
    monkeypatch.setattr(bare, "args_source", pytest.Config.ArgsSource.TESTPATHS)
    params = dataclasses.replace(bare.invocation_params, args=("--dist", "load"))
    monkeypatch.setattr(bare, "invocation_params", params)
    assert not every_cpu_by_default(bare)


def test_without_xdist_nothing_changes(
    bare: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bare.pluginmanager, "hasplugin", lambda name: name != "xdist")
    assert not every_cpu_by_default(bare)
