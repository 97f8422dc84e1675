"""Systematic durability mutants, generated from the AST of the ``substrat`` package.

The catalog (:mod:`oracle.mutant_catalog`) holds the bugs someone thought of.
This module makes the others: every call that makes something durable, writes
an event to a log, or repairs or replays state during recovery, each deleted on
its own. A deleted call whose mutant no test notices is either redundant (then
it goes) or a blind spot (then a test comes), and docs/mutants.md lists the
few that stay with the reason why.

A mutant is named by where the call is, not by line: ``file:function:call#k``
is the ``k``-th such call in ``function`` of ``file``, where ``call`` is the
callee with its first argument when that is a plain name (for example
``eventlog.py:EventLog.log:persistence.fsync_fd(self._fd)#1`` or
``restore.py:apply:host.logs.get().log(events.TURN_FAILED)#1``), so the
names survive code motion and the calls that other code adds around them, and
an allow-list entry keeps meaning the same call.

Deleting means: a call that is a statement of its own becomes ``pass``; a call
whose value is used becomes a neutral value of the type the caller expects
(``0`` for a log's seq, ``False`` for a durable primitive's "did something").
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PRIMITIVES = frozenset(
    {
        "fsync_fd",
        "fsync_dir",
        "atomic_write",
        "durable_create",
        "durable_mkdir",
        "durable_unlink",
        "durable_rename",
        "durable_contents",
        "fsync",
    }
)
"""The durable primitives of substrat.persistence, and ``os.fsync`` itself."""

LOG_WRITES = frozenset({"log", "_log_creation"})
"""An event written to an event log (``EventLog.log`` and the orchestrator's wrappers)."""

REPAIR_STEPS = frozenset(
    {
        "ftruncate",
        "write_all",
        "_pwrite_all",
        "transition",
        "save",
        "materialize_child",
        "terminate_now",
        "_cascade_terminate",
        "deliver",
        "deliver_data",
        "_cut_back_suspect_tail",
        "_take_back",
        "_unlink_quietly",
    }
)
"""Steps that repair or replay durable state (cut a torn tail, replay an entry,
finish a cascade, roll an effect forward, rebuild an inbox). They count only
inside the recovery and repair code below."""

IN_MEMORY = frozenset({"session.transition"})
"""Calls named like a step that only change memory (``Session.transition``; the
store's ``transition`` that persists it is a step)."""

REPAIR_FILES = frozenset(
    {
        "recovery.py",
        "restore.py",
        "rollforward.py",
        "eventlog.py",
        "session/store.py",
        "fsck.py",
        "fsck_repair.py",
        "registry.py",
        "logs.py",
        "commit.py",
    }
)
"""Where :data:`REPAIR_STEPS` are recovery or repair steps (``commit.py``'s
``apply_effects`` is the roll-forward that recovery shares with a live turn)."""

SKIPPED_FILES = frozenset({"demo.py"})
"""Not durability code: the demo only drives a daemon."""

_NEUTRAL = {"log": "0", "durable_mkdir": "False", "durable_unlink": "False"}
"""What a deleted call whose value is used evaluates to instead."""


@dataclass(frozen=True)
class Site:
    """One call that a systematic mutant deletes."""

    file: str
    """Relative to the package, with ``/`` separators."""
    function: str
    """Qualified name inside the module (``Class.method``), ``<module>`` at top level."""
    callee: str
    """The call's function as written, with its first argument if that is a plain
    name (``persistence.fsync_fd(fd)``, ``log.log(events.TURN_START)``)."""
    index: int
    """1-based: the ``index``-th call of ``callee`` in ``function``."""
    kind: str
    """``primitive``, ``log`` or ``repair``."""
    line: int
    """Where it is now (for the report only; the name does not depend on it)."""

    @property
    def name(self) -> str:
        return f"{self.file}:{self.function}:{self.callee}#{self.index}"

    @property
    def description(self) -> str:
        what = {"primitive": "durable call", "log": "event-log write", "repair": "repair step"}
        shown = self.callee if self.callee.endswith(")") else self.callee + "()"
        return f"delete the {what[self.kind]} {shown} in {self.function}"


def _callee(call: ast.Call) -> tuple[str, str] | None:
    """(text as written, last name) of a call's function; None for other shapes."""
    parts: list[str] = []
    node: ast.expr = call.func
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call):
        inner = _callee(node)
        if inner is None:
            return None
        parts.append(inner[0] + "()")
    else:
        return None
    return ".".join(reversed(parts)), parts[0]


def _first_argument(call: ast.Call) -> str:
    """``(name)`` when the first positional argument is a plain (dotted) name, else ``""``."""
    if not call.args:
        return ""
    parts: list[str] = []
    node = call.args[0]
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    parts.append(node.id)
    return "(" + ".".join(reversed(parts)) + ")"


def _kind(file: str, text: str, last: str, call: ast.Call) -> str | None:
    if text in IN_MEMORY:
        return None
    if last in PRIMITIVES:
        return "primitive"
    if last in LOG_WRITES and (call.args or last == "_log_creation"):
        return "log"
    if last in REPAIR_STEPS and file in REPAIR_FILES:
        return "repair"
    return None


class _Finder(ast.NodeVisitor):
    def __init__(self, file: str) -> None:
        self.file = file
        self.scope: list[str] = []
        self.sites: list[tuple[Site, ast.Call, ast.stmt]] = []
        self._counts: dict[tuple[str, str], int] = {}
        self._stmt: list[ast.stmt] = []

    def _function(self) -> str:
        return ".".join(self.scope) or "<module>"

    def _scoped(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = _scoped
    visit_FunctionDef = _scoped
    visit_AsyncFunctionDef = _scoped

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.stmt):
            self._stmt.append(node)
            super().generic_visit(node)
            self._stmt.pop()
        else:
            super().generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        found = _callee(node)
        if found is not None:
            text, last = found
            kind = _kind(self.file, text, last, node)
            if kind is not None and self._stmt:
                key = (self._function(), text + _first_argument(node))
                self._counts[key] = self._counts.get(key, 0) + 1
                site = Site(self.file, key[0], key[1], self._counts[key], kind, node.lineno)
                self.sites.append((site, node, self._stmt[-1]))
        self.generic_visit(node)


def _parse(path: Path, file: str) -> list[tuple[Site, ast.Call, ast.stmt]]:
    finder = _Finder(file)
    finder.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return finder.sites


def _files(package: Path) -> Iterator[tuple[Path, str]]:
    for path in sorted(package.rglob("*.py")):
        file = path.relative_to(package).as_posix()
        if file not in SKIPPED_FILES:
            yield path, file


def sites(package: Path) -> list[Site]:
    """Every call a systematic mutant deletes, in file order."""
    return [site for path, file in _files(package) for site, _, _ in _parse(path, file)]


def _offset(lines: list[str], line: int, col: int) -> int:
    """Character offset of (1-based line, byte column) in the joined text."""
    before = sum(len(text) for text in lines[: line - 1])
    return before + len(lines[line - 1].encode("utf-8")[:col].decode("utf-8"))


def delete(package: Path, name: str) -> None:
    """Delete the call ``name`` (see :attr:`Site.name`) in the package copy at ``package``.

    Raises LookupError when no such call exists any more (the code changed).
    """
    file = name.split(":", 1)[0]
    path = package / file
    if not path.is_file():
        raise LookupError(f"{name}: {file} does not exist")
    matches = [(s, call, stmt) for s, call, stmt in _parse(path, file) if s.name == name]
    if len(matches) != 1:
        raise LookupError(f"{name}: no such call in {file} (the code changed?)")
    site, call, stmt = matches[0]
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    value = stmt.value if isinstance(stmt, ast.Expr) else None
    if isinstance(value, ast.Await):
        value = value.value
    whole = value is call
    target: ast.stmt | ast.expr = stmt if whole else call
    assert target.end_lineno is not None and target.end_col_offset is not None
    start = _offset(lines, target.lineno, target.col_offset)
    end = _offset(lines, target.end_lineno, target.end_col_offset)
    last = site.callee.split("(", 1)[0].rsplit(".", 1)[-1]
    replacement = "pass" if whole else _NEUTRAL.get(last, "None")
    path.write_text(text[:start] + replacement + text[end:], encoding="utf-8")
