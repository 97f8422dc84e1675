"""oracle.bench_step_calls: the lifecycle fuzzer's calls per step, counted the same every run."""

from __future__ import annotations

from oracle import bench_step_calls
from oracle.lifecycle import LifecycleMachine


def test_the_same_examples_make_the_same_steps_and_faultfs_calls() -> None:
    first = bench_step_calls.count_lifecycle(examples=2, steps=6)
    second = bench_step_calls.count_lifecycle(examples=2, steps=6)
    # Python and C calls can move by a few in one process (first-use caches); a fresh
    # process per tree makes them exact (see the module docstring)
    assert {k: (v.times, v.faultfs) for k, v in first.items()} == {
        k: (v.times, v.faultfs) for k, v in second.items()
    }
    assert all(v.python > 0 and v.c > 0 for v in first.values())
    known = {*bench_step_calls.STEPS, "reopen_clean", "reopen_crash"} - {"reopen"}
    assert set(first) <= known and "create_root" in first and "check_all" in first
    # a root's creation is durable (its record, its log), a check only reads
    assert first["create_root"].faultfs["fsync"] > 0
    checks = first["check_all"].faultfs
    assert not any(checks[kind] for kind in bench_step_calls.DURABLE_CALLS)
    assert "| create_root |" in bench_step_calls.render(first)


def test_counting_puts_the_machine_back() -> None:
    before = {name: LifecycleMachine.__dict__.get(name) for name in bench_step_calls.STEPS}
    bench_step_calls.count_lifecycle(examples=1, steps=3)
    assert {name: LifecycleMachine.__dict__.get(name) for name in bench_step_calls.STEPS} == before
