"""A kill -9 of an in-process orchestrator, as the tests and the lifecycle fuzzer simulate it."""

from __future__ import annotations

from substrat.orchestrator import Orchestrator


def abandon(orch: Orchestrator) -> None:
    """Drop ``orch`` as a kill would: every descriptor it holds is closed, nothing else runs.

    Nothing is closed cleanly: no session is suspended, no pending file removed.
    The descriptors are the agents' logs in the pool and the root registry's
    log. One left open leaks per simulated kill, and a fuzzer that kills
    thousands of times (the lifecycle fuzzer under ``nightly``) then dies of
    EMFILE on a machine with the usual limit of 1024 open files.
    """
    logs = list(orch.logs._open.values())
    registry_log = orch.roots._log
    if registry_log is not None:
        logs.append(registry_log)
    for log in logs:
        log._poison()
