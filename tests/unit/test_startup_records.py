"""The records every process defines as it starts are NamedTuples, not dataclasses.

A frozen dataclass compiles six generated methods, one ``exec`` each, as its class is
defined: about 1-1.7 ms per class, in each of the ~800 CLI processes and ~290 daemons of
a main job run (issue 17). A ``typing.NamedTuple`` takes about 0.09 ms.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from substrat.providers.base import ToolSpec
from substrat.rootdir import RootInfo, RootState
from substrat.rpc.lock import LockInfo
from substrat.rpc.protocol import Request
from substrat.rpc.server import Param
from substrat.segments import Position, Segment

RECORDS = (LockInfo, RootInfo, Request, Position, Segment, ToolSpec, Param)

DATACLASSES = r"""
import dataclasses, json, sys
import substrat.cli.common, substrat.client, substrat.rpc.starting
print(json.dumps(sorted(
    f"{cls.__module__}.{cls.__qualname__}"
    for name, module in list(sys.modules.items()) if name.startswith("substrat")
    for cls in vars(module).values()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == name
)))
"""


def test_a_command_sending_a_request_defines_one_dataclass() -> None:
    # what every `substrat` command imports before it sends its request: only the
    # command line's own options are a dataclass (LockInfo, RootInfo and Request were)
    done = subprocess.run(
        [sys.executable, "-c", DATACLASSES], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["substrat.cli.common.Opts"]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_a_record_reads_compares_and_hashes_by_its_fields(record: type) -> None:
    assert not dataclasses.is_dataclass(record)
    fields = record._fields  # type: ignore[attr-defined]
    values = {name: f"v{i}" for i, name in enumerate(fields)}
    one, same = record(**values), record(**values)
    assert one == same and hash(one) == hash(same)
    assert (
        repr(one)
        == f"{record.__name__}("
        + ", ".join(f"{name}={value!r}" for name, value in values.items())
        + ")"
    )
    with pytest.raises(AttributeError):  # read-only, as the frozen dataclass was
        setattr(one, fields[0], "other")
    assert record(**{**values, fields[-1]: "other"}) != one


def test_the_records_defaults_and_properties_stay() -> None:
    info = LockInfo(1, "t", "running")
    assert info.socket is None and info.summary_unsaved is None
    root = RootInfo(path=Path("/r"), state=RootState.ROOT)
    assert root.version is None and root.strangers == () and root.is_root
    assert Request("ping", {}).id is None and not Request("ping", {}).is_notification
    assert Param("n", (int,)).required and Param("n", (int,)).max_chars is None
    segment = Segment(1, 9, Path("/l/events.1-9.jsonl.gz"))
    assert segment.name == "events.1-9.jsonl.gz" and segment.archived
    assert not segment._replace(path=Path("/l/events.1-9.jsonl")).archived
