"""The test modules' assertion rewriting, done once for all xdist workers of a run.

pytest compiles every test module (and ``conftest.py``) through its assertion
rewriter and keeps the result as a ``.pyc`` in the bytecode cache. The session's
cache (tests/conftest.py) starts empty, and the xdist workers all start at once:
each of them rewrote the same 200-odd test modules, about 4.5 CPU s apiece on this
machine (docs/benchmarks.md, the main job's other costs). Here the controller, which
runs no test, rewrites them in a thread while the workers start, into the cache
where the workers look; a worker that finds a module's ``.pyc`` loads it, one that
gets there first rewrites the module itself as before. The ``.pyc`` is pytest's own
(its rewriter, its file format, its atomic write), so what a worker loads is what it
would have written.

The workers share the rest out: before it collects, each rewrites its own part of
the same list (:func:`worker_share`, every N-th module from its index), so on an empty
cache each module is rewritten about once in all rather than once per worker. That
covers a run that writes bytecode beside the sources too (CI, a fresh clone), where
the workers' cache is each source's ``__pycache__``: there all three workers of the
main job rewrote all 470-odd modules at once, about 8 CPU s each (docs/benchmarks.md,
the collection's CPU).

pytest has no public interface for this (``_pytest.assertion.rewrite``); if a
release changes one of the functions used here, nothing is written and the run costs
what it did before (tests/unit/test_rewrite_ahead.py then skips the tests of
rewriting, naming the missing functions, and still checks the fallback).
"""

from __future__ import annotations

import fnmatch
import importlib.util
import itertools
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest


def module_files(paths: Iterable[Path], patterns: Iterable[str]) -> Iterator[Path]:
    """The files under ``paths`` pytest would rewrite as test modules, in collection order.

    ``conftest.py`` and files matching ``patterns`` (pytest's ``python_files``);
    hidden directories and ``__pycache__`` are skipped, as pytest's collection does.
    """
    patterns = tuple(patterns)

    def wanted(name: str) -> bool:
        return name == "conftest.py" or any(fnmatch.fnmatch(name, p) for p in patterns)

    for path in paths:
        if path.is_file():
            if wanted(path.name):
                yield path
            continue
        for where, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
            for name in sorted(names):
                if name.endswith(".py") and wanted(name):
                    yield Path(where, name)


def marked_package_files() -> Iterator[Path]:
    """The modules of this project's packages that pytest rewrites (its distribution
    registers a ``pytest11`` plugin, so pytest rewrites all of it; every worker imports all
    of it before its first test, oracle.local_constants)."""
    from oracle.local_constants import PACKAGES

    marked: set[str] = set()
    for finder in sys.meta_path:
        marked.update(getattr(finder, "_must_rewrite", ()))
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if name not in marked or spec is None or not spec.submodule_search_locations:
            continue
        for location in spec.submodule_search_locations:
            for where, dirs, names in os.walk(location):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                for file in sorted(names):
                    if file.endswith(".py") and file != "__main__.py":
                        yield Path(where, file)


PRIVATE_NAMES = (
    "assertstate_key",
    "get_cache_dir",
    "PYC_TAIL",
    "_read_pyc",
    "_rewrite_test",
    "try_makedirs",
    "_write_pyc",
)


def missing_private_names() -> list[str]:
    """The private names of ``_pytest.assertion.rewrite`` used here that this pytest lacks."""
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return list(PRIVATE_NAMES)
    return [name for name in PRIVATE_NAMES if not hasattr(rewrite, name)]


def rewrite_into(
    config: pytest.Config, files: Iterable[Path], prefix: str | None, stop: threading.Event
) -> int:
    """Rewrite ``files`` as pytest does and store each where a process with bytecode
    prefix ``prefix`` looks for it (None: where this process looks); how many were written.

    Files already there and current are left alone; a file that does not parse is
    left to the worker, which reports it.
    """
    from _pytest.assertion import rewrite  # private: see the module docstring

    state = config.stash[rewrite.assertstate_key]
    written = 0
    for fn in files:
        if stop.is_set():
            break
        fn = fn.resolve()
        # rewrite.get_cache_dir, under the workers' prefix where that is not this process's
        cache_dir = rewrite.get_cache_dir(fn) if prefix is None else Path(prefix, *fn.parts[1:-1])
        pyc = cache_dir / (fn.name[:-3] + rewrite.PYC_TAIL)
        if rewrite._read_pyc(fn, pyc) is not None:
            continue
        try:
            source_hash, code = rewrite._rewrite_test(fn, config)
        except (SyntaxError, ValueError, OSError):
            continue
        if not rewrite.try_makedirs(cache_dir):
            return written
        written += rewrite._write_pyc(state, code, source_hash, pyc)
    return written


def modules_of_the_run(config: pytest.Config) -> list[Path]:
    """The run's test modules and ``conftest.py`` files, in collection order."""
    root = config.invocation_params.dir
    paths = [Path(root, arg.split("::")[0]) for arg in config.args]
    return list(module_files(paths, config.getini("python_files")))


class RewriteAhead:
    """:func:`rewrite_into` on a daemon thread; :meth:`stop` ends it and waits.

    The project's packages first (each worker imports them as it starts, before it
    collects), then the test modules from the last: the workers take theirs from the
    first (:func:`worker_share`), so the two meet rather than rewrite the same module.
    """

    def __init__(self, config: pytest.Config, prefix: str | None) -> None:
        files = itertools.chain(marked_package_files(), reversed(modules_of_the_run(config)))
        self._stop = threading.Event()
        self.written: int | None = None
        self._thread = threading.Thread(
            target=self._run, args=(config, files, prefix), name="rewrite-ahead", daemon=True
        )
        self._thread.start()

    def _run(self, config: pytest.Config, files: Iterable[Path], prefix: str | None) -> None:
        try:
            self.written = rewrite_into(config, files, prefix, self._stop)
        except (ImportError, AttributeError, TypeError, KeyError) as exc:
            # pytest changed its private rewriting functions: the workers rewrite as before.
            print(f"rewrite ahead: not done ({exc!r})", file=sys.stderr)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def rewrites(config: Any) -> bool:
    """Whether this process rewrites asserts and keeps what it rewrote (``--assert=rewrite``,
    bytecode writing on)."""
    return config.getoption("assertmode") == "rewrite" and not sys.dont_write_bytecode


def start(config: Any, prefix: str | None) -> RewriteAhead | None:
    """Rewrite the run's test modules ahead of its xdist workers (None: not a distributed run).

    ``prefix``: the workers' bytecode prefix when it is not this process's own (None: the
    workers look where this process does, and so it must keep what it rewrites).
    """
    if config.pluginmanager.getplugin("dsession") is None:
        return None
    if config.getoption("assertmode") != "rewrite" or (prefix is None and sys.dont_write_bytecode):
        return None
    return RewriteAhead(config, prefix)


def worker_share(config: Any) -> int | None:
    """On xdist worker ``gwK`` of N, rewrite every N-th of the run's modules from the K-th
    before collecting; how many it wrote (None: not such a worker, or nothing to keep).

    Every worker starts on the same empty cache and imports the same modules in the same
    order, so each rewrote all of them. Dealt out like this, each rewrites its part while
    the others rewrite theirs, and collecting then finds the rest already written (a
    module another worker has not reached yet is rewritten here too, as before).
    """
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or not rewrites(config):
        return None
    count, name = workerinput.get("workercount", 1), str(workerinput.get("workerid", ""))
    if count < 2 or not name.startswith("gw") or not name[2:].isdigit():
        return None
    files = [*modules_of_the_run(config), *marked_package_files()]
    try:
        return rewrite_into(config, files[int(name[2:]) % count :: count], None, threading.Event())
    except (ImportError, AttributeError, TypeError, KeyError) as exc:
        # pytest changed its private rewriting functions: the worker rewrites as before.
        print(f"rewrite ahead: not done ({exc!r})", file=sys.stderr)
        return None
