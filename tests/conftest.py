"""Shared fixtures for substrat's own tests, and how many xdist workers get which tests."""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support import linked_bytecode, rewrite_ahead

T = TypeVar("T")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A fresh substrat root on the real file system."""
    path = tmp_path / "root"
    path.mkdir()
    return path


def dist_named(config: pytest.Config) -> bool:
    """Whether the command line (or PYTEST_ADDOPTS) chose an xdist ``--dist`` mode."""
    words = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]
    return any(w in ("--dist", "-d", "--distload") or w.startswith("--dist=") for w in words)


EXTRA_WORKERS_PER_CPU = 0.25
"""``-n auto``'s workers beyond one per usable CPU, as a fraction of the CPUs (at least one).

About a sixth of the items' wall time in the main job is spent waiting, not
computing: on daemons and CLI processes they started, on sockets, on paced
turns. With one worker per CPU that time leaves a CPU idle; one more worker on
this 2-core machine fills it (docs/benchmarks.md, issue 17's seventh pass)."""


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    count = len(affinity(0)) if affinity is not None else os.cpu_count()
    return max(1, count or 1)


def auto_workers(cpus: int) -> int:
    """``-n auto``'s worker count on ``cpus`` usable CPUs."""
    assert cpus >= 1, "at least one CPU"
    return cpus + max(1, int(cpus * EXTRA_WORKERS_PER_CPU))


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: a worker per usable CPU plus :data:`EXTRA_WORKERS_PER_CPU`.

    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` and ``-n logical`` are left to xdist.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or config.option.numprocesses == "logical":
        return None
    return auto_workers(usable_cpus())


def every_cpu_by_default(config: pytest.Config) -> bool:
    """Whether this run is the README's bare ``pytest`` (the whole suite, no ``-n``), which
    runs on every CPU as ``-n auto`` would.

    In one process the default run took 577-596 s on this 2-core machine, at the edge of
    the ten minutes CI allows it; every test in it also runs in the main job under
    ``-n auto``, so distributing it changes no result. A run that names paths (one file,
    one test), asks for one process (``-n 0``, ``-p no:xdist``), a ``--dist`` mode, live
    output (``-s``), ``--pdb``, step-wise runs or only a collection stays in one process.
    """
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return False
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return False
    if config.option.numprocesses is not None or dist_named(config):
        return False
    single = ("collectonly", "usepdb", "stepwise", "stepwise_skip")
    if any(config.getoption(name, False) for name in single):
        return False
    return bool(config.getoption("capture", "fd") != "no")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns "auto" into a count
def pytest_cmdline_main(config: pytest.Config) -> None:
    if every_cpu_by_default(config):
        config.option.numprocesses = "auto"


def steals_work(config: pytest.Config) -> bool:
    """Whether this xdist run hands tests out by work stealing (ours or a chosen one)."""
    dist = config.getoption("dist")
    return dist == "worksteal" or (dist == "load" and not dist_named(config))


STEALS_WORK = "substrat_steals_work"
"""The key of a worker's ``workerinput`` that says :func:`steals_work` of its controller
(a worker's own options say ``--dist no``)."""


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput[STEALS_WORK] = steals_work(node.config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n N`` without a ``--dist``: xdist's work-stealing scheduler, not ``load``.

    ``load`` hands out the collection in chunks sized by what is left to send, so
    near the end one worker can hold a long run of real tests while the other
    has nothing left but instant ones: without ``--run-stress`` the last quarter
    of the collection is stress tests that skip, and in the default run one of
    two workers sat idle for the last 68-105 s of 300-555 (docs/benchmarks.md,
    issue 17's sixth pass). ``worksteal`` moves queued tests to an idle worker.
    An explicit ``--dist`` is left alone.
    """
    if config.getoption("dist") != "load" or dist_named(config):
        return None
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)


COVERED_MARK = "covered_under_stress"
"""A default-run test that a stress test covers whole: ``@pytest.mark.covered_under_stress(
"tests/stress/test_x.py::test_y")``. Under ``--run-stress`` it skips when that test runs in
the same session: the main job ran both, the small one for nothing."""


WAITS_MARK = "waits"
"""An item that mostly waits (on the daemons and CLI processes it starts, on a timer, on a
time budget it tests) for seconds: ``pytestmark = pytest.mark.waits``. Under xdist's work
stealing it runs first in a share of a worker beyond the CPUs (:func:`long_items_first`)."""


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what they deselect
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--run-stress``, skip each :data:`COVERED_MARK` test whose cover runs too; on
    an xdist worker that steals work, order the items as :func:`long_items_first`."""
    if config.getoption("--run-stress", default=False):
        running = {item.nodeid.split("[")[0] for item in items}
        for item in items:
            mark = item.get_closest_marker(COVERED_MARK)
            if mark is None:
                continue
            (cover,) = mark.args
            if cover in running:
                item.add_marker(pytest.mark.skip(reason=f"covered under --run-stress by {cover}"))
    workerinput = getattr(config, "workerinput", {})
    workers = workerinput.get("workercount", 1)
    if workers > 1 and workerinput.get(STEALS_WORK):
        stress = config.getoption("--run-stress", default=False)
        items[:] = long_items_first(
            items,
            workers,
            lambda i: stress and i.get_closest_marker("stress") is not None,
            lambda i: i.get_closest_marker(WAITS_MARK) is not None,
            waiting_shares=max(0, workers - usable_cpus()),
        )


def worksteal_shares(count: int, workers: int) -> list[int]:
    """How many of ``count`` items xdist's work stealing hands each worker at the start.

    Consecutive runs of the collection: the first worker gets ``count // workers``, each
    next one an equal part of what is left (``WorkStealingScheduling.check_schedule``)."""
    shares = []
    for i in range(workers):
        shares.append((count - sum(shares)) // (workers - i))
    return shares


def long_items_first(
    items: list[T],
    workers: int,
    is_stress: Callable[[T], bool],
    waits: Callable[[T], bool],
    waiting_shares: int = 0,
) -> list[T]:
    """The items reordered so that each worker's first share starts with its part of the
    long items, and the quick ones follow in collection order.

    The stress items (about half the main job's CPU in a tenth of its items) are dealt
    out like cards to the first ``workers - waiting_shares`` shares; the items that
    mostly wait (:data:`WAITS_MARK`) to the last ``waiting_shares`` shares, the workers
    beyond one per CPU (:data:`EXTRA_WORKERS_PER_CPU`), or to every share when there
    are none. The quick items fill the shares in collection order, so the waiting shares
    end with the collection's end, the integration tests, which also wait on daemons
    and CLI processes.

    Why: in collection order the stress items all fell in the last worker's share and
    the run ended on whichever of them were left, one worker busy and the others idle.
    Dealt to every share, they kept the CPUs busy first, but all the waiting came
    after them, at the end of the run: two of three workers waiting at once and a CPU
    idle, and the end of the run on a 33 s item that waits on a time budget
    (docs/benchmarks.md, issue 17, session 30). Now a worker waits while the others
    compute, and idle workers steal quick items from the shares' ends. Each share
    keeps a module's items in their order, so a module's fixtures are set up at most
    once per share. The same order on every worker, as xdist requires: it depends on
    the collection, the worker count and the CPUs only.
    """
    assert workers >= 1 and waiting_shares >= 0, (workers, waiting_shares)
    waiting_shares = min(waiting_shares, workers - 1)  # one share deals the stress items
    dealers = workers - waiting_shares
    stress = [item for item in items if is_stress(item)]
    waiting = [item for item in items if not is_stress(item) and waits(item)]
    if not stress and not waiting:
        return items
    others = iter([item for item in items if not is_stress(item) and not waits(item)])
    waiters = list(range(dealers, workers)) or list(range(workers))
    ordered: list[T] = []
    for k, share in enumerate(worksteal_shares(len(items), workers)):
        dealt = stress[k::dealers] if k < dealers else []
        if k in waiters:
            dealt = dealt + waiting[waiters.index(k) :: len(waiters)]
        ordered += dealt
        ordered += itertools.islice(others, max(0, share - len(dealt)))
    ordered += others  # a share smaller than its long items: the rest at the end
    return ordered


BYTECODE_PREFIX_KEY = pytest.StashKey[tuple[str, str]]()
REWRITE_AHEAD_KEY = pytest.StashKey[rewrite_ahead.RewriteAhead]()
BYTECODE_PREFIX_NAME = "substrat-tests-pyc-"
"""How the session's bytecode cache is named (in the temporary directory)."""


def other_user_bytecode_prefix(uid: int) -> str | None:
    """A bytecode cache beside the session's that a child running as ``uid`` can write.

    The session's cache is private to the user running the tests, so a child run as
    another user (tests/support/privileges.py) compiled substrat and its dependencies
    from source at each start. This one (``<session cache>-uid<uid>``, that user's,
    mode 0700) is shared by that user's children and removed with the session's.
    None when the run has no session cache of its own (nothing to be beside).
    """
    prefix = os.environ.get("PYTHONPYCACHEPREFIX", "")
    if not os.path.basename(prefix).startswith(BYTECODE_PREFIX_NAME):
        return None
    theirs = f"{prefix}-uid{uid}"
    with contextlib.suppress(FileExistsError):  # an xdist worker made it first
        os.mkdir(theirs, 0o700)
    os.chown(theirs, uid, uid)
    return theirs


NOT_LINKED = frozenset(
    {"test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "site-packages"}
)
"""Directories at the top of a ``sys.path`` entry whose bytecode no test imports (the standard
library's own test suite, its GUIs) or that are another entry (the interpreter's own
site-packages, beside the environment's)."""


def link_installed_bytecode(
    prefix: str, entries: list[str] | None = None, wanted: frozenset[str] | None = None
) -> int:
    """Link the bytecode installed beside the interpreter's modules into ``prefix``; how many.

    A process with a bytecode prefix looks for bytecode there only: each xdist worker,
    started with the session's new, empty cache, compiled the standard library and every
    installed package it imports from source (about 3.6 of the 11-19 CPU s that one
    collection of the main job took, load 14), while the compiled files sat beside the
    sources, and the first daemons and CLI commands did too. A symbolic link where the
    prefix maps each source hands them over (about 5,000 links, 0.8-1.0 CPU s); a stale
    one is compiled again and replaced (Python writes a new file over the link, never
    through it). The checkout itself is left out: its modules are what changes. Of the
    top-level modules of each ``sys.path`` entry (``entries``), only those named in
    ``wanted`` (tests/support/linked_bytecode.py) are linked, all when it is None.
    """
    checkout = Path(__file__).resolve().parents[1]
    suffix = f".{sys.implementation.cache_tag}.pyc"

    def top_level(name: str) -> bool:
        return wanted is None or name in wanted

    linked = 0
    for entry in dict.fromkeys(sys.path if entries is None else entries):
        if not entry or not os.path.isdir(entry) or Path(entry).resolve().is_relative_to(checkout):
            continue
        top_cache = os.path.join(entry, "__pycache__")
        for where, dirs, names in os.walk(entry):
            if where == entry:
                dirs[:] = [
                    d for d in dirs if d not in NOT_LINKED and (d == "__pycache__" or top_level(d))
                ]
            if os.path.basename(where) != "__pycache__":
                continue
            dirs[:] = []
            compiled = [name for name in names if name.endswith(suffix)]
            if where == top_cache:  # the entry's single-file modules: ``os.py``, ``six.py``
                compiled = [name for name in compiled if top_level(name.partition(".")[0])]
            if not compiled:
                continue
            mirror = os.path.join(prefix, os.path.dirname(where).lstrip(os.sep))
            os.makedirs(mirror, exist_ok=True)
            for name in compiled:
                with contextlib.suppress(FileExistsError):
                    os.symlink(os.path.join(where, name), os.path.join(mirror, name))
                    linked += 1
    return linked


FINAL_COLLECTIONS = 1
"""Full garbage collections at a process's end before pytest reports the unraisable
exceptions left (``_pytest.unraisableexception``'s ``gc_collect_iterations_key``).

pytest 9.0 runs five at every process's end, the Trio project's count for PyPy, where a
``__del__`` can resurrect what it finalizes; on CPython reference counting frees the rest
and one collection frees every cycle, and pytest 9.2 does one there by default. Each
collection walks the whole heap: 0.08-0.12 CPU s each for an xdist worker after 600 unit
tests (120,000-140,000 objects), more with a larger heap (docs/benchmarks.md, "The main
job's start and end")."""


def fewer_final_collections(config: pytest.Config) -> None:
    """On CPython, one collection at the process's end (:data:`FINAL_COLLECTIONS`) unless
    something (pytester's inline runs) chose a count already."""
    from _pytest import unraisableexception

    key = getattr(unraisableexception, "gc_collect_iterations_key", None)
    if sys.implementation.name == "cpython" and key is not None and key not in config.stash:
        config.stash[key] = FINAL_COLLECTIONS


def pytest_configure(config: pytest.Config) -> None:
    """Let the processes the tests start share compiled bytecode in a private directory.

    Where bytecode writing is off (``PYTHONDONTWRITEBYTECODE``, as on the
    machines this project is tested on) every daemon and CLI command a test
    starts compiles substrat, its dependencies and the standard library from
    source again: the main job starts several hundred, and the CLI and daemon
    tests spent about a quarter of their CPU compiling (docs/benchmarks.md,
    issue 17's eighth pass). Here the xdist workers and those processes get a
    bytecode cache under a new temporary directory (``PYTHONPYCACHEPREFIX``),
    filled by the first process that imports a module and removed when the run
    ends: nothing is written beside the sources, which is what the setting
    asks. The bytecode installed with the interpreter and the packages is linked
    in first (:func:`link_installed_bytecode`). A run that already names a prefix,
    or writes bytecode, is left alone.
    """
    fewer_final_collections(config)
    if hasattr(config, "workerinput"):  # an xdist worker: it inherited the controller's choice
        return
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    prefix = tempfile.mkdtemp(prefix=BYTECODE_PREFIX_NAME)
    link_installed_bytecode(prefix, wanted=linked_bytecode.wanted_top_levels())
    config.stash[BYTECODE_PREFIX_KEY] = (prefix, os.environ["PYTHONDONTWRITEBYTECODE"])
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    del os.environ["PYTHONDONTWRITEBYTECODE"]


@pytest.hookimpl(tryfirst=True)  # before xdist's DSession starts the workers
def pytest_sessionstart(session: pytest.Session) -> None:
    """In a distributed run, rewrite the test modules once for all workers, not once in each
    (tests/support/rewrite_ahead.py): the controller while they start, into their cache
    (the session's, or beside the sources), and each worker its share before it collects."""
    config = session.config
    if hasattr(config, "workerinput"):
        rewrite_ahead.worker_share(config)
        return
    saved = config.stash.get(BYTECODE_PREFIX_KEY, None)
    ahead = rewrite_ahead.start(config, None if saved is None else saved[0])
    if ahead is not None:
        config.stash[REWRITE_AHEAD_KEY] = ahead


def pytest_collection_finish(session: pytest.Session) -> None:
    """The tests' daemons are forked off a warm interpreter where that cannot differ from a
    fresh start (tests/support/warm_daemons.py). Here, after the set-up above and before
    any test's monkeypatch: what warm.py takes as its baseline when imported."""
    if session.items:
        from tests.support import warm_daemons

        warm_daemons.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    warm = sys.modules.get("tests.support.warm")
    if warm is not None:  # this process ran commands through a fork server: stop it
        warm.shutdown()
    ahead = config.stash.get(REWRITE_AHEAD_KEY, None)
    if ahead is not None:
        ahead.stop()
    saved = config.stash.get(BYTECODE_PREFIX_KEY, None)
    if saved is None:
        return
    prefix, dont_write = saved
    os.environ.pop("PYTHONPYCACHEPREFIX", None)
    os.environ["PYTHONDONTWRITEBYTECODE"] = dont_write
    shutil.rmtree(prefix, ignore_errors=True)
    for theirs in glob.glob(f"{glob.escape(prefix)}-uid*"):  # other_user_bytecode_prefix's
        shutil.rmtree(theirs, ignore_errors=True)
