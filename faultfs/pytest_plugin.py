"""pytest plugin: the ``faultfs`` fixture and the ``faultfs_explore`` helper.

Registered through the ``pytest11`` entry point: it is all that installing the
distribution adds to another project's test run (substrat's stress gate and
Hypothesis profiles are opt-in, see :mod:`oracle.pytest_plugin`)::

    def test_save(faultfs):
        save(faultfs.path("state.json"), {"a": 1})    # plain open/os code
        faultfs.arm(3)
        ...

Options go in a marker: ``@pytest.mark.faultfs(profile="ext4-ordered",
outside="passthrough", block_size=512, suppress_health_check=[...])``; they
are FaultFS's (``block_size`` is the torn-write unit in bytes, 4096 by
default) and ``faultfs_explore`` passes ``profile``, ``block_size``,
``outside`` and ``suppress_health_check`` on to explore().

Paths outside the root are refused by default (``outside="refuse"``). After a
passing test the fixture runs the ``no_boundaries`` and ``outside_root``
health checks; a simulated descriptor that reached the real os through a name
bound before activation fails the test with EscapeError naming it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from faultfs import (
    _check_posix,  # noqa: F401  (first: on Windows it says why faultfs cannot run)
    _health,
    _others,
    _realdisk,
)
from faultfs._arguments import accepted_names, unknown_argument
from faultfs._escapes import diagnose
from faultfs._explore import explore
from faultfs._fs import FaultFS
from faultfs._health import HealthCheck
from faultfs._report import ExploreReport
from faultfs._trace import in_faultfs
from faultfs.errors import FailedHealthCheck, FaultFSError

_MARKER = "faultfs"
_FIXTURE_OPTIONS = (
    *("profile", "outside", "block_size", "record_trace", "root", "suppress_health_check"),
)
# The fixture's FaultFS, its suppressed checks and the real tree under its root before the test.
_ACTIVE = pytest.StashKey[tuple[FaultFS, frozenset[HealthCheck], _realdisk.State | None]]()
# Set once the real directory's change has been reported, so teardown does not report it again.
_REAL_DISK_REPORTED = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(profile='posix', outside='refuse', block_size=4096, root=None, "
        "suppress_health_check=()): options for the faultfs fixtures "
        "(block_size: the torn-write unit in bytes)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Name escapes in a failing faultfs test; run the fixture's health checks on a passing one."""
    __tracebackhide__ = True
    active = item.stash.get(_ACTIVE, None)
    uses_faultfs = active is not None or "faultfs_explore" in getattr(item, "fixturenames", ())
    first: str | None = None
    try:
        result = yield
    except Exception as exc:
        first = _real_disk_first(item, active, f"{type(exc).__name__}: {exc}")
        if first is None:
            roots = (active[0].root,) if active is not None else ()
            escape = diagnose(exc, roots) if uses_faultfs else None
            if escape is not None:
                raise escape from exc
            if isinstance(exc, FaultFSError):
                _drop_faultfs_frames(exc)  # the user's line that made the call is what matters
            raise
    else:
        first = _real_disk_first(item, active, None)
    if first is not None:
        pytest.fail(first, pytrace=False)  # outside the except: the cause, then what followed
    if active is not None:
        fs, off, _ = active
        _health.check_escapes(fs)
        _fail_cleanly(_health.check_outside, fs, "the test", off)
        _fail_cleanly(_health.check_boundaries, fs, "the test", off)
    return result


def _real_disk_first(
    item: pytest.Item,
    active: tuple[FaultFS, frozenset[HealthCheck], _realdisk.State | None] | None,
    then: str | None,
) -> str | None:
    """What reached the real directory under the root, as the test's failure; None if nothing.

    Writes made around Python's os and io (a C extension, another process)
    explain whatever the test or a health check says next (no boundary passed,
    a store that cannot read its own files), so they are said first, and the
    test's own error after them.
    """
    if active is None:
        return None
    fs, _, before = active
    what = _realdisk.changes(fs.root, before)
    if what is None:
        return None
    item.stash[_REAL_DISK_REPORTED] = True
    message = f"faultfs: {_realdisk.message(fs.root, what)}"
    if then is not None:
        message += f"\n\nThe test then failed with {then}"
    return message


def _drop_faultfs_frames(exc: BaseException) -> None:
    """Unlink faultfs's own frames from ``exc``'s traceback (pytest shows what is left)."""
    kept = []
    tb = exc.__traceback__
    while tb is not None:
        if not in_faultfs(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    if not kept:
        return
    for outer, inner in itertools.pairwise(kept):
        outer.tb_next = inner
    kept[-1].tb_next = None
    exc.__traceback__ = kept[0]


def _fail_cleanly(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(...)``; a failed health check fails the test with its message alone."""
    try:
        return call(*args, **kwargs)
    except FailedHealthCheck as failed:
        message = f"{type(failed).__name__}: {failed}"
    pytest.fail(message, pytrace=False)


def _options(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker(_MARKER)
    options = dict(marker.kwargs) if marker is not None else {}
    for name, value in options.items():
        if name not in _FIXTURE_OPTIONS:
            wrong = unknown_argument("@pytest.mark.faultfs(...)", name, value, _FIXTURE_OPTIONS)
            raise pytest.UsageError(str(wrong))
    return options


def _tmp_path(request: pytest.FixtureRequest) -> Path:
    """pytest's tmp_path, asked for only once pyfakefs is known not to be patching.

    Under pyfakefs's ``fs`` fixture tmp_path fails with a message about
    numbered directories that does not say why; faultfs's own says.
    """
    if _others.pyfakefs_active():
        pytest.fail(f"faultfs: pyfakefs is active in this test. {_others.WHY}", pytrace=False)
    path: Path = request.getfixturevalue("tmp_path")
    return path


def _trap_root(tmp_path: Path) -> str:
    """A new, empty real directory as the root; its files exist only in the model.

    Real, so that faultfs's escape audit hook guards it: a call that went
    around the interceptors (a name bound where no scan reaches) is stopped
    with EscapeError and recorded even when the code swallows the error, which
    under a path that does not exist would have failed unseen with ENOENT.
    Empty, so that whatever writes there without Python's os and io (a C
    extension such as sqlite3) leaves files that :func:`_check_trap` reports.
    """
    path = tmp_path / "faultfs"
    path.mkdir(parents=True)
    return str(path)


def _check_trap(root: str, before: _realdisk.State | None) -> None:
    """Fail the test if anything changed in the real directory under the root (FaultFS inactive)."""
    what = _realdisk.changes(root, before)
    if what is not None:
        pytest.fail(f"faultfs: {_realdisk.message(root, what)}", pytrace=False)


@pytest.fixture
def faultfs(request: pytest.FixtureRequest) -> Iterator[FaultFS]:
    """An active FaultFS; ``faultfs.root`` (and ``faultfs.path(...)``) is where to work."""
    tmp_path = _tmp_path(request)
    options = _options(request)
    given = options.pop("root", None)
    root = str(given) if given else _trap_root(tmp_path)
    off = _health.suppressed(options.pop("suppress_health_check", ()))
    options.setdefault("outside", "refuse")
    fs = FaultFS(root, **options)
    fs.watch_outside = True
    before = _realdisk.state(root)
    request.node.stash[_ACTIVE] = (fs, off, before)
    with fs:
        yield fs
    if not request.node.stash.get(_REAL_DISK_REPORTED, False):
        _check_trap(root, before)


@pytest.fixture
def faultfs_explore(request: pytest.FixtureRequest) -> Callable[..., ExploreReport]:
    """``faultfs_explore(workload, recover_and_check, **explore_kwargs)``.

    Runs explore() under a fresh empty root and fails the test with the
    report (its causes, source paths relative to the rootdir, no traceback)
    unless ``expect_failures=True`` is passed.
    """
    tmp_path = _tmp_path(request)
    options = _options(request)
    calls = itertools.count(1)

    def run(
        workload: Callable[[FaultFS], Any],
        recover_and_check: Callable[[FaultFS], Any],
        *,
        expect_failures: bool = False,
        **kwargs: Any,
    ) -> ExploreReport:
        _check_explore_arguments(kwargs)
        kwargs.setdefault(
            "root", options.get("root") or _trap_root(tmp_path / f"explore-{next(calls)}")
        )
        for name in ("profile", "block_size", "outside", "suppress_health_check"):
            if name in options:
                kwargs.setdefault(name, options[name])
        # explore checks the real directory under the root itself (faultfs._realdisk).
        report: ExploreReport = _fail_cleanly(explore, workload, recover_and_check, **kwargs)
        if not expect_failures and not report.ok:
            pytest.fail(report.text(str(request.config.rootpath)), pytrace=False)
        return report

    return run


def _check_explore_arguments(kwargs: dict[str, Any]) -> None:
    """An argument explore() does not take is a ConfigError saying which one was meant."""
    accepted = [
        name for name in accepted_names(explore) if name not in ("workload", "recover_and_check")
    ] + ["expect_failures"]
    for name, value in kwargs.items():
        if name not in accepted:
            where = "faultfs_explore(workload, recover_and_check, ...)"
            raise unknown_argument(where, name, value, accepted)
