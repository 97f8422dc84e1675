"""A kill -9 of an in-process orchestrator, as the tests and the lifecycle fuzzer simulate it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported by benchmarks that load the orchestrator only when they run
    from substrat.orchestrator import Orchestrator


def abandon(orch: Orchestrator) -> None:
    """Drop ``orch`` as a kill would: every descriptor it holds is closed, nothing else runs.

    Nothing is closed cleanly: no session is suspended, no pending file removed.
    The descriptors are the agents' logs in the pool, the root registry's
    log and the orchestrator's hold on its root (substrat.root_hold, which a
    kill gives back: the next open must not find the root still held). One
    left open leaks per simulated kill, and a fuzzer that kills
    thousands of times (the lifecycle fuzzer under ``nightly``) then dies of
    EMFILE on a machine with the usual limit of 1024 open files.
    """
    logs = list(orch.logs._open.values())
    registry_log = orch.roots._log
    if registry_log is not None:
        logs.append(registry_log)
    for log in logs:
        log._poison()
    if orch.hold is not None:
        orch.hold.release()  # the kernel drops a dead process's flock on its root


def exit_without_close(orch: Orchestrator) -> None:
    """``orch``'s process exits without the orchestrator's clean close.

    Its logs are closed as a process's exit leaves them (each file closed, the
    pending copies removed by their own close) and its hold on the root is
    given back; no session is suspended and no checkpoint or start summary is
    written, so the disk stays as the run left it.
    """
    orch.logs.close_all()
    if orch.hold is not None:
        orch.hold.release()
