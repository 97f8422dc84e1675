"""The root registry: a deleted root directory is lost data, reported, never silently dropped.

* fsck and the daemon (recovery report, ``daemon status``) report a registered
  root whose directory is gone; everything else is served.
* Crash rule (create, then register): a crash at any boundary of
  ``create_root`` never makes a root look lost, and a root committed but not
  yet registered is registered by recovery (the sweep, with the oracle's
  registry check, at every boundary; the oracle catches a create_root that
  does not register).
* A damaged or unusable registry does not stop the daemon: it is reported,
  rebuilt from the logs, and repaired by ``fsck --repair``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from oracle.harness import CrashHarness
from oracle.sweep import Scenario, sweep
from oracle.workload import Step
from substrat import fsck
from substrat.client import Client, DaemonProcess
from substrat.orchestrator import Orchestrator
from tests.support.roots import cli, three_roots


@pytest.fixture
def built(root: Path) -> dict[str, str]:
    return asyncio.run(three_roots(root))


def _served(root: Path) -> set[str]:
    with Client(root) as client:
        return {a["path"] for a in client.call("agent.list")}


def test_a_deleted_root_directory_is_reported_as_lost(root: Path, built: dict[str, str]) -> None:
    beta = built["beta"]
    shutil.rmtree(root / "agents" / beta)

    report = fsck.check(root)
    assert report.kinds() == {"lost_root": 1} and report.exit_code == 1
    (finding,) = report.problems
    assert finding.path == f"agents/{beta}" and "restore" in finding.detail
    repaired = fsck.check(root, repair=True)
    assert [f.repaired for f in repaired.problems] == [False], "nothing can bring it back"
    assert fsck.check(root).exit_code == 1, "a lost root is never reported clean"

    dry = cli(root, "recover", "--dry-run")
    assert [r["session_id"] for r in json.loads(dry.stdout)["lost_roots"]] == [beta]

    with DaemonProcess(root).start() as daemon:
        assert _served(root) == {"alpha", "alpha/kid", "gamma"}
        status = json.loads(cli(root, "daemon", "status").stdout)
        assert [r["session_id"] for r in status["lost_roots"]] == [beta]
        assert "restore" in status["lost_roots"][0]["what_to_do"]
        lost = status["last_recovery"]["report"]["lost_roots"]
        assert [(r["session_id"], r["name"]) for r in lost] == [(beta, "beta")]
        text = cli(root, "daemon", "status", as_json=False).stdout
        assert "lost root agent" in text and beta in text
        daemon.terminate()
    assert "lost root agent" in (root / "daemon.log").read_text()


def test_a_deleted_root_log_is_lost_data_at_every_start(root: Path, built: dict[str, str]) -> None:
    """Not an orphan to terminate (which would silence it from the next start on)."""
    gamma = built["gamma"]
    (root / "agents" / gamma / "events.jsonl").unlink()
    for _ in range(2):
        report = fsck.check(root)
        assert report.kinds() == {"lost_root": 1}
        assert report.problems[0].path == f"agents/{gamma}/events.jsonl"

        async def reopen() -> tuple[set[str], list[str]]:
            orch = await Orchestrator.open(root)
            await orch.close()
            assert orch.recovery_report is not None
            lost = [r["session_id"] for r in orch.recovery_report.lost_roots]
            return {a.path for a in orch.agents()}, lost

        assert asyncio.run(reopen()) == ({"alpha", "alpha/kid", "beta"}, [gamma])


def test_the_registry_lists_every_root_and_only_roots(root: Path, built: dict[str, str]) -> None:
    from substrat.registry import read_registry

    registered = read_registry(root).roots
    assert set(registered) == {built["alpha"], built["beta"], built["gamma"]}
    assert registered[built["alpha"]]["name"] == "alpha"


def test_a_root_from_before_the_registry_is_registered_at_the_next_start(
    root: Path, built: dict[str, str]
) -> None:
    shutil.rmtree(root / "roots")
    assert fsck.check(root).kinds() == {"unregistered_root": 3}

    async def reopen() -> list[str]:
        orch = await Orchestrator.open(root)
        await orch.close()
        assert orch.recovery_report is not None
        return orch.recovery_report.roots_registered

    assert sorted(asyncio.run(reopen())) == sorted([built["alpha"], built["beta"], built["gamma"]])
    assert asyncio.run(reopen()) == []
    assert fsck.check(root).exit_code == 0
    shutil.rmtree(root / "agents" / built["gamma"])
    assert fsck.check(root).kinds() == {"lost_root": 1}


def test_a_damaged_registry_line_costs_nothing(root: Path, built: dict[str, str]) -> None:
    path = root / "roots" / "events.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"beta"', b'"betb"')
    path.write_bytes(b"".join(lines))
    report = fsck.check(root)
    assert report.kinds() == {"damaged_line": 1, "unregistered_root": 1}

    spare = root.parent / "spare"
    shutil.copytree(root, spare)
    with DaemonProcess(root).start() as daemon:
        assert _served(root) == {"alpha", "alpha/kid", "beta", "gamma"}
        status = json.loads(cli(root, "daemon", "status").stdout)
        assert status["last_recovery"]["report"]["roots_registered"] == [built["beta"]]
        daemon.terminate()

    repaired = fsck.check(spare, repair=True)
    assert all(f.repaired for f in repaired.problems), repaired.problems
    assert fsck.check(spare).exit_code == 0
    shutil.rmtree(spare / "agents" / built["beta"])
    assert fsck.check(spare).kinds() == {"lost_root": 1}, "the rebuilt registry knows beta"


@pytest.mark.parametrize("shape", ["directory_as_log", "file_as_directory"])
def test_an_unusable_registry_does_not_stop_the_daemon(
    root: Path, built: dict[str, str], shape: str
) -> None:
    shutil.rmtree(root / "roots")
    if shape == "directory_as_log":
        (root / "roots" / "events.jsonl").mkdir(parents=True)
    else:
        (root / "roots").write_text("not a registry")
    report = fsck.check(root)
    assert report.kinds() == {"bad_registry": 1}

    with DaemonProcess(root).start() as daemon:
        assert _served(root) == {"alpha", "alpha/kid", "beta", "gamma"}
        status = json.loads(cli(root, "daemon", "status").stdout)
        assert status["registry_problem"]
        made = cli(root, "agent", "create", "delta")
        assert made.returncode == 1
        assert "fsck --repair" in json.loads(made.stderr)["error"]["message"]
        daemon.terminate()

    repaired = fsck.check(root, repair=True)
    assert all(f.repaired for f in repaired.problems), repaired.problems
    assert fsck.check(root).exit_code == 0
    assert any(p.name.startswith("registry.") for p in (root / "quarantine").iterdir())

    async def create() -> None:
        orch = await Orchestrator.open(root)
        await orch.create_root("delta")
        await orch.close()

    asyncio.run(create())
    shutil.rmtree(root / "agents" / built["alpha"])
    assert fsck.check(root).kinds() == {"lost_root": 1}


def test_create_root_is_refused_while_the_registry_is_unusable(root: Path) -> None:
    from substrat.errors import RootRegistryError

    (root / "roots").write_text("not a registry")

    async def attempt() -> None:
        orch = await Orchestrator.open(root)
        try:
            assert orch.recovery_report is not None
            assert orch.recovery_report.registry_problem is not None
            with pytest.raises(RootRegistryError, match="fsck --repair"):
                await orch.create_root("alpha")
            assert not (root / "agents").exists() or not list((root / "agents").iterdir())
        finally:
            await orch.close()

    asyncio.run(attempt())


def _registry_boundaries(steps: list[Step]) -> tuple[int, int]:
    """(boundaries of the registry's files, all boundaries) of running ``steps``."""
    harness = CrashHarness(record_trace=True)
    start = harness.fs.boundaries
    harness.run_steps(steps)
    harness.close()
    total = harness.fs.boundaries - start
    ops = [op for op in harness.fs.trace if "/roots" in op.path]
    return 2 * len(ops), total


def test_every_crash_point_of_create_root_is_swept_and_none_looks_lost() -> None:
    """Every boundary of two create_roots, every mode, recovery crashed too: the oracle's
    registry check (no root reported lost; an acknowledged root registered before the
    crash; every live root registered after recovery) holds at each."""
    steps = (Step("create_root", "ada"), Step("create_root", "bob"), Step("turn", "ada"))
    registry_boundaries, total = _registry_boundaries(list(steps))
    assert registry_boundaries >= 8, "the registry's writes are crash points"
    result = sweep(Scenario("two roots", steps))
    assert result.boundaries == total
    assert not result.failures, "\n\n".join(result.failures)
    assert result.recovery_states > 0


def test_the_oracle_catches_a_create_root_that_does_not_register(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted bug: create_root acknowledges before (here: without) registering."""

    class Unregistered:
        def __init__(self, real: Any) -> None:
            self.real = real

        def check_usable(self) -> None:
            self.real.check_usable()

        def register(self, data: dict[str, Any]) -> None:
            return None

    original = Orchestrator.create_root

    async def create_root(self: Orchestrator, *args: Any, **kwargs: Any) -> Any:
        real = self.roots
        self.roots = Unregistered(real)  # type: ignore[assignment]
        try:
            return await original(self, *args, **kwargs)
        finally:
            self.roots = real

    monkeypatch.setattr(Orchestrator, "create_root", create_root)
    scenario = Scenario("roots", (Step("create_root", "ada"), Step("turn", "ada")))
    result = sweep(scenario, modes=("process",), recovery_crashes=False, max_failures=1)
    assert result.failures
    assert "was not registered before the crash" in result.failures[0]


@pytest.mark.parametrize(
    "shape, usable",
    [
        ("missing", True),
        ("plain", True),
        ("directory_linked", True),
        ("log_linked", True),
        ("directory_as_log", False),
        ("file_as_directory", False),
        ("dangling_log_link", False),
        ("log_linked_to_a_directory", False),
    ],
)
def test_the_registry_load_tells_each_shape(tmp_path: Path, shape: str, usable: bool) -> None:
    """RootRegistry.load looks at each path once (lstat) and follows a symlink only when
    it meets one: a symlinked directory or log is read as its target, anything else
    that is not a directory holding a regular file is a problem, never an exception."""
    from substrat.registry import FIELDS, RootRegistry

    entry = {field: f"x{i}" for i, field in enumerate(FIELDS)}
    entry["session_id"] = "a" * 32
    made = RootRegistry(tmp_path / "made")
    made.register(entry)
    made.close()
    kept = tmp_path / "made" / "roots"
    root = tmp_path / "root"
    root.mkdir()
    if shape == "plain":
        shutil.copytree(kept, root / "roots")
    elif shape == "directory_linked":
        (root / "roots").symlink_to(kept, target_is_directory=True)
    elif shape == "log_linked":
        (root / "roots").mkdir()
        (root / "roots" / "events.jsonl").symlink_to(kept / "events.jsonl")
    elif shape == "directory_as_log":
        (root / "roots" / "events.jsonl").mkdir(parents=True)
    elif shape == "file_as_directory":
        (root / "roots").write_text("not a registry")
    elif shape == "dangling_log_link":
        (root / "roots").mkdir()
        (root / "roots" / "events.jsonl").symlink_to(tmp_path / "nowhere")
    elif shape == "log_linked_to_a_directory":
        (root / "roots").mkdir()
        (root / "roots" / "events.jsonl").symlink_to(kept, target_is_directory=True)
    read = RootRegistry(root).load()
    assert (read.problem is None) == usable, read.problem
    holds = shape in ("plain", "directory_linked", "log_linked")
    assert list(read.roots) == (["a" * 32] if holds else [])


def test_a_register_after_the_load_does_not_read_the_registry_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load's repair says where the registry ends: the next root's register opens the
    log there (nothing else writes it while the root is held) and numbers on from it."""
    from substrat import eventlog
    from substrat.registry import FIELDS, RootRegistry

    def entry(letter: str) -> dict[str, Any]:
        return {field: letter * 32 if field == "session_id" else letter for field in FIELDS}

    first = RootRegistry(tmp_path)
    first.register(entry("a"))
    first.close()
    registry = RootRegistry(tmp_path)
    assert list(registry.load().roots) == ["a" * 32]
    scans: list[int] = []
    scan = eventlog._scan_for_repair
    monkeypatch.setattr(
        eventlog, "_scan_for_repair", lambda *args: scans.append(args[3]) or scan(*args)
    )
    registry.register(entry("b"))
    registry.close()
    assert scans == [], "the register scanned what the load had just read"
    lines = (tmp_path / "roots" / "events.jsonl").read_bytes().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [1, 2]
    assert list(RootRegistry(tmp_path).load().roots) == ["a" * 32, "b" * 32]
