"""The test modules are rewritten once for all xdist workers, not once in each (rewrite_ahead.py):
by the controller while they start, and by each worker its share before it collects."""

from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from _pytest.assertion import rewrite

import faultfs
import substrat
from tests.support import rewrite_ahead

# A newer pytest may drop the private functions rewriting ahead uses: the run then costs
# what it did before (the fallback's test below), and these tests say why they skip.
_MISSING = rewrite_ahead.missing_private_names()
needs_pytest_internals = pytest.mark.skipif(
    bool(_MISSING),
    reason=f"pytest {pytest.__version__} lacks _pytest.assertion.rewrite.{', '.join(_MISSING)}: "
    "rewriting ahead is off, each xdist worker rewrites its test modules as before",
)

SAMPLE = "def test_sum():\n    total = 1 + 1\n    assert total == 2, total\n"


@needs_pytest_internals
def test_a_worker_loads_the_module_rewritten_ahead_instead_of_rewriting_it(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = tmp_path / "src" / "test_ahead_sample.py"
    source.parent.mkdir()
    source.write_text(SAMPLE)
    prefix = tmp_path / "pyc"
    stop = threading.Event()
    assert rewrite_ahead.rewrite_into(pytestconfig, [source], str(prefix), stop) == 1
    assert rewrite_ahead.rewrite_into(pytestconfig, [source], str(prefix), stop) == 0  # current

    # A worker: bytecode written under the prefix; pytest's import hook finds the module.
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.syspath_prepend(str(source.parent))

    def no_rewrite(fn: Path, config: pytest.Config) -> None:
        raise AssertionError(f"{fn} was rewritten again")

    monkeypatch.setattr(rewrite, "_rewrite_test", no_rewrite)
    try:
        module = importlib.import_module("test_ahead_sample")
        assert isinstance(module.__loader__, rewrite.AssertionRewritingHook)
        module.test_sum()
    finally:
        sys.modules.pop("test_ahead_sample", None)


@needs_pytest_internals
def test_a_source_that_does_not_parse_is_left_to_the_worker(
    pytestconfig: pytest.Config, tmp_path: Path
) -> None:
    bad, good = tmp_path / "test_bad.py", tmp_path / "test_good.py"
    bad.write_text("def test_x(:\n")
    good.write_text(SAMPLE)
    prefix = tmp_path / "pyc"
    assert (
        rewrite_ahead.rewrite_into(pytestconfig, [bad, good], str(prefix), threading.Event()) == 1
    )
    assert [p.name.split(".")[0] for p in prefix.rglob("*.pyc")] == ["test_good"]


@needs_pytest_internals
def test_a_stopped_rewrite_writes_nothing_more(pytestconfig: pytest.Config, tmp_path: Path) -> None:
    (tmp_path / "test_one.py").write_text(SAMPLE)
    stop = threading.Event()
    stop.set()
    assert rewrite_ahead.rewrite_into(pytestconfig, [tmp_path / "test_one.py"], "/x", stop) == 0


def test_the_files_are_pytest_s_test_modules_and_conftests_in_collection_order(
    tmp_path: Path,
) -> None:
    for name in (
        "b/test_two.py",
        "b/helper.py",
        "a/conftest.py",
        "a/test_one.py",
        "a/one_test.py",
        ".hidden/test_no.py",
        "a/__pycache__/test_no.py",
        "test_top.py",
        "test_notes.txt",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    found = rewrite_ahead.module_files([tmp_path, tmp_path / "b/helper.py"], ["test_*.py"])
    assert [p.relative_to(tmp_path).as_posix() for p in found] == [
        "test_top.py",
        "a/conftest.py",
        "a/test_one.py",
        "b/test_two.py",
    ]


def test_the_project_s_packages_that_pytest_rewrites_are_rewritten_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # pytest marks a whole distribution for rewriting when it registers a pytest11 plugin
    # (an editable install of this one does); here, as if it marked substrat and faultfs.
    others = [finder for finder in sys.meta_path if not hasattr(finder, "_must_rewrite")]
    marks = SimpleNamespace(_must_rewrite={"substrat", "faultfs"})
    monkeypatch.setattr(sys, "meta_path", [*others, marks])
    files = {p.as_posix() for p in rewrite_ahead.marked_package_files()}
    substrat_dir = Path(substrat.__file__).parent.as_posix()
    faultfs_dir = Path(faultfs.__file__).parent.as_posix()
    assert f"{substrat_dir}/daemon.py" in files
    assert f"{faultfs_dir}/__init__.py" in files
    assert not [f for f in files if "/oracle/" in f]  # not marked: left alone


class WorkerConfig:
    """This run's config as xdist worker ``workerinput`` would see it."""

    def __init__(self, config: pytest.Config, workerinput: dict[str, object]) -> None:
        self._config, self.workerinput = config, workerinput

    def __getattr__(self, name: str) -> object:
        return getattr(self._config, name)


class PlainConfig:
    """This run's config as a process that is no xdist worker would see it."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config

    def __getattr__(self, name: str) -> object:
        if name == "workerinput":
            raise AttributeError(name)
        return getattr(self._config, name)


def sample_modules(tmp_path: Path, count: int) -> list[Path]:
    (tmp_path / "src").mkdir()
    modules = [tmp_path / "src" / f"test_share_{i}.py" for i in range(count)]
    for module in modules:
        module.write_text(SAMPLE)
    return modules


@needs_pytest_internals
def test_each_worker_rewrites_every_nth_module_from_its_own_index_into_its_cache(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    modules = sample_modules(tmp_path, 7)
    monkeypatch.setattr(rewrite_ahead, "modules_of_the_run", lambda config: modules[:5])
    monkeypatch.setattr(rewrite_ahead, "marked_package_files", lambda: iter(modules[5:]))
    prefix = tmp_path / "pyc"
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))  # as the session's cache sets it
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    worker = WorkerConfig(pytestconfig, {"workerid": "gw1", "workercount": 3})
    assert rewrite_ahead.worker_share(worker) == 2
    written = sorted(p.name.split(".")[0] for p in prefix.rglob("*.pyc"))
    assert written == ["test_share_1", "test_share_4"]
    # Where pytest's import hook looks for them, in its own format: current, so loaded.
    for i in (1, 4):
        pyc = rewrite.get_cache_dir(modules[i]) / (modules[i].name[:-3] + rewrite.PYC_TAIL)
        assert rewrite._read_pyc(modules[i], pyc) is not None
    # Another worker leaves the modules already written alone and writes its own.
    other = WorkerConfig(pytestconfig, {"workerid": "gw2", "workercount": 3})
    assert rewrite_ahead.worker_share(other) == 2  # 2 and 5
    assert rewrite_ahead.worker_share(worker) == 0


@needs_pytest_internals
def test_a_worker_that_keeps_no_bytecode_or_is_alone_rewrites_nothing_ahead(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    modules = sample_modules(tmp_path, 2)
    monkeypatch.setattr(rewrite_ahead, "modules_of_the_run", lambda config: modules)
    monkeypatch.setattr(rewrite_ahead, "marked_package_files", lambda: iter(()))
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "pyc"))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # pytest keeps nothing either
    assert (
        rewrite_ahead.worker_share(
            WorkerConfig(pytestconfig, {"workerid": "gw0", "workercount": 2})
        )
        is None
    )
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert (
        rewrite_ahead.worker_share(
            WorkerConfig(pytestconfig, {"workerid": "gw0", "workercount": 1})
        )
        is None
    )
    assert rewrite_ahead.worker_share(PlainConfig(pytestconfig)) is None  # not a worker
    assert not (tmp_path / "pyc").exists()


def test_the_controller_takes_the_packages_then_the_test_modules_from_the_last(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workers take the test modules from the first: the two meet in the middle.
    taken: list[Path] = []

    def record(config: object, files: list[Path], prefix: str | None, stop: object) -> int:
        taken.extend(files)
        return 0

    tests_, package = [Path("t1.py"), Path("t2.py"), Path("t3.py")], Path("pkg.py")
    monkeypatch.setattr(rewrite_ahead, "rewrite_into", record)
    monkeypatch.setattr(rewrite_ahead, "modules_of_the_run", lambda config: tests_)
    monkeypatch.setattr(rewrite_ahead, "marked_package_files", lambda: iter([package]))
    rewrite_ahead.RewriteAhead(pytestconfig, None).stop()
    assert taken == [package, *reversed(tests_)]


def test_only_an_xdist_controller_rewrites_ahead(pytestconfig: pytest.Config) -> None:
    # This process is a plain pytest run or an xdist worker: neither has a DSession.
    assert rewrite_ahead.start(pytestconfig, "/nowhere") is None


def test_a_pytest_without_those_functions_leaves_the_workers_to_rewrite(
    pytestconfig: pytest.Config,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delattr(rewrite, "_rewrite_test", raising=False)
    ahead = rewrite_ahead.RewriteAhead.__new__(rewrite_ahead.RewriteAhead)
    ahead.written, ahead._stop = None, threading.Event()
    (tmp_path / "test_one.py").write_text(SAMPLE)
    ahead._run(pytestconfig, [tmp_path / "test_one.py"], str(tmp_path / "pyc"))
    assert ahead.written is None
    assert "rewrite ahead: not done" in capsys.readouterr().err
    assert not (tmp_path / "pyc").exists()
