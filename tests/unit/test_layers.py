"""Dependencies inside ``substrat`` go one way: no import circles.

Every ``import`` statement in every module counts, wherever it sits: at the
top, inside a function (a lazy import) or under ``if TYPE_CHECKING`` (a
circle that only the type checker sees is still a circle in the design).
Recovery in particular imports nothing from the orchestrator: it turns the
disk into a value that the orchestrator applies.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "substrat"
LAYERED = ("recovery", "orchestrator", "commit", "wake", "tools")
"""The modules issue 16 named as importing each other in a circle."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache  # parsing every module is most of each test's time: once for the three
def import_graph() -> dict[str, set[str]]:
    """Module -> the substrat modules it imports (every statement, lazy and typing ones too).

    One graph for every caller: read it, do not change it."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from substrat import events` imports the module substrat.events; a
                # name that is not a module is taken from `base` itself
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target != "substrat":
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_lazy_and_typing_imports() -> None:
    graph = import_graph()
    # a module-level import, a TYPE_CHECKING one and a function-level one
    assert "substrat.events" in graph["substrat.commit"]
    assert "substrat.orchestrator" in graph["substrat.rpc.methods"]  # under TYPE_CHECKING
    assert "substrat.demo" in graph["substrat.daemon_providers"]  # inside a function


def test_no_import_circle_in_substrat() -> None:
    found = cycles(import_graph())
    assert not found, "import circles (each a set of modules that import each other): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_recovery_imports_nothing_from_the_orchestrator() -> None:
    graph = import_graph()
    reachable: set[str] = set()
    todo = ["substrat.recovery"]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in reachable:
                reachable.add(nxt)
                todo.append(nxt)
    forbidden = {f"substrat.{m}" for m in LAYERED if m != "recovery"}
    assert not reachable & forbidden, sorted(reachable & forbidden)
