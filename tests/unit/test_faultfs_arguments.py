"""A misspelled keyword argument of any public entry point is a ConfigError with the fix.

Python's own TypeError ("got an unexpected keyword argument") names neither the
option meant nor the accepted ones; each entry point below says both, as the
fixtures did already (commit d755e2a). A TypeError raised inside the body stays
what it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from faultfs import ConfigError, FaultFS, explore
from faultfs._arguments import checked
from faultfs.lazyfs import LazyFS
from faultfs.stateful import rule

ROOT = "/faultfs-arguments"


def crashed() -> FaultFS:
    fs = FaultFS(ROOT)
    fs.arm(1)
    with fs:
        try:
            with open(fs.path("f"), "wb") as handle:
                handle.write(b"x")
        except BaseException:
            pass
    return fs


CALLS: list[tuple[str, Any, str]] = [
    (
        "explore(mode=)",
        lambda: explore(lambda fs: None, lambda img: None, mode="power"),  # type: ignore[call-arg]
        r"^explore\(\) takes no argument 'mode'; did you mean modes='power'\? It takes block_size,",
    ),
    (
        "FaultFS(profiles=)",
        lambda: FaultFS(ROOT, profiles="posix"),  # type: ignore[call-arg]
        r"^FaultFS\(\) takes no argument 'profiles'; did you mean profile='posix'\?",
    ),
    (
        "crash_image(modes=)",
        lambda: crashed().crash_image(modes="power"),  # type: ignore[call-arg]
        r"^FaultFS\.crash_image\(\) takes no argument 'modes'; did you mean mode='power'\?",
    ),
    (
        "crash_images(limits=)",
        lambda: crashed().crash_images("torn", limits=3),  # type: ignore[call-arg]
        r"takes no argument 'limits'; did you mean limit=3\? It takes limit, mode, seed$",
    ),
    (
        "tree(durabel=)",
        lambda: FaultFS(ROOT).tree(durabel=True),  # type: ignore[call-arg]
        r"^FaultFS\.tree\(\) takes no argument 'durabel'; did you mean durable=True\?",
    ),
    (
        "from_snapshot(record=)",
        lambda: FaultFS.from_snapshot(FaultFS(ROOT).snapshot(), record_traces=False),  # type: ignore[call-arg]
        r"no argument 'record_traces'; did you mean record_trace=False\?",
    ),
    (
        "fail_writes_with(after=)",
        lambda: FaultFS(ROOT).fail_writes_with(after=10),  # type: ignore[call-arg]
        r"no argument 'after'; did you mean after_bytes=10\?",
    ),
    (
        "capture_at(on_captured=)",
        lambda: FaultFS(ROOT).capture_at([1], on_captured=print),  # type: ignore[call-arg]
        r"no argument 'on_captured'; did you mean on_capture=",
    ),
    (
        "rule(crash=)",
        lambda: rule(crashs=False),  # type: ignore[arg-type]
        r"^rule\(\) takes no argument 'crashs'; did you mean crashes=False\?",
    ),
]


@pytest.mark.parametrize(("call", "expected"), [c[1:] for c in CALLS], ids=[c[0] for c in CALLS])
def test_a_misspelled_option_names_the_one_meant(call: Any, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        call()


def test_report_text_and_lazyfs_say_the_same(tmp_path: Path) -> None:
    def workload(fs: FaultFS) -> None:
        with open(fs.path("f"), "wb") as handle:
            handle.write(b"x")
        fs.ack(1)

    report = explore(workload, lambda img: img.tree())
    with pytest.raises(ConfigError, match=r"did you mean source_root='/src'\?"):
        report.text(source_roots="/src")  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"^LazyFS\(\) takes .* did you mean cache_size_bytes=1"):
        LazyFS(tmp_path, tmp_path, cache_size=1)  # type: ignore[call-arg]
    lazy = LazyFS.__new__(LazyFS)
    with pytest.raises(ConfigError, match=r"^LazyFS\.mount\(\) .* did you mean timeout_s=1"):
        lazy.mount(timeout=1)  # type: ignore[call-arg]


def test_a_rule_keeps_its_strategies() -> None:
    assert callable(rule(n=st.integers(), crashes=False))
    with pytest.raises(ConfigError, match=r"n=5 is not one$"):
        rule(n=5)  # type: ignore[arg-type]


def test_a_type_error_inside_the_body_stays_a_type_error() -> None:
    @checked
    def inner(value: int = 0) -> int:
        return value + "x"  # type: ignore[operator]

    with pytest.raises(TypeError, match="unsupported operand"):
        inner(value=1)
    with pytest.raises(ConfigError, match="did you mean value=1"):
        inner(valeu=1)  # type: ignore[call-arg]
