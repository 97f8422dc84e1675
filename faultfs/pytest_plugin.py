"""pytest plugin: the ``faultfs`` fixture and the ``faultfs_explore`` helper.

Registered through the ``pytest11`` entry point: it is all that installing the
distribution adds to another project's test run (substrat's stress gate and
Hypothesis profiles are opt-in, see :mod:`oracle.pytest_plugin`)::

    def test_save(faultfs):
        save(faultfs.path("state.json"), {"a": 1})    # plain open/os code
        faultfs.arm(3)
        ...

Options go in a marker: ``@pytest.mark.faultfs(profile="ext4-ordered",
outside="refuse", block_size=512)``; they are FaultFS's (``block_size`` is
the torn-write unit in bytes, 4096 by default) and ``faultfs_explore`` passes
``profile`` and ``block_size`` on to explore().
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from faultfs._explore import explore
from faultfs._fs import FaultFS
from faultfs._report import ExploreReport

_MARKER = "faultfs"
_FIXTURE_OPTIONS = ("profile", "outside", "block_size", "record_trace", "root")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(profile='posix', outside='passthrough', block_size=4096, root=None): "
        "options for the faultfs fixtures (block_size: the torn-write unit in bytes)",
    )


def _options(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker(_MARKER)
    options = dict(marker.kwargs) if marker is not None else {}
    unknown = set(options) - set(_FIXTURE_OPTIONS)
    if unknown:
        raise pytest.UsageError(
            f"@pytest.mark.faultfs got unknown options {sorted(unknown)}; "
            f"accepted: {list(_FIXTURE_OPTIONS)}"
        )
    return options


def _virtual_root(tmp_path: Path) -> str:
    # A unique path that nothing real lives under: files there exist only in
    # the model, so a test cannot accidentally read the real disk instead.
    return str(tmp_path / "faultfs")


@pytest.fixture
def faultfs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FaultFS]:
    """An active FaultFS; ``faultfs.root`` (and ``faultfs.path(...)``) is where to work."""
    options = _options(request)
    root = options.pop("root", None) or _virtual_root(tmp_path)
    fs = FaultFS(root, **options)
    with fs:
        yield fs


@pytest.fixture
def faultfs_explore(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., ExploreReport]:
    """``faultfs_explore(workload, recover_and_check, **explore_kwargs)``.

    Runs explore() under a fresh virtual root and fails the test with the
    report (its causes, source paths relative to the rootdir, no traceback)
    unless ``expect_failures=True`` is passed.
    """
    options = _options(request)

    def run(
        workload: Callable[[FaultFS], Any],
        recover_and_check: Callable[[FaultFS], Any],
        *,
        expect_failures: bool = False,
        **kwargs: Any,
    ) -> ExploreReport:
        kwargs.setdefault("root", options.get("root") or _virtual_root(tmp_path))
        for name in ("profile", "block_size"):
            if name in options:
                kwargs.setdefault(name, options[name])
        report = explore(workload, recover_and_check, **kwargs)
        if not expect_failures and not report.ok:
            pytest.fail(report.text(str(request.config.rootpath)), pytrace=False)
        return report

    return run
