"""Which installed modules' bytecode the session's cache links in (tests/conftest.py).

The session's bytecode cache links the bytecode installed beside the interpreter's
modules so that no process compiles them again (``link_installed_bytecode``). Linked
whole, an interpreter with a large site-packages (the image CI runs in: about 14,500
compiled files of packages such as cfnlint, moto, sympy and scipy, none of which a test
imports) took 15,000 symbolic links, 4-7 CPU s before the first worker started and about
1 s more to remove them at the end (docs/benchmarks.md, "The main job's start and end").
Only the top-level modules a test process can import are linked: the standard library,
what the controller has imported already (pytest, its plugins, the ``.pth`` start-up
hooks) and the distributions substrat depends on with all its extras, with theirs, and
the pytest plugins installed. A module left out is not an error: the first process that
imports it compiles it into the cache, once for the session.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterable
from importlib import metadata


def top_levels(dist: metadata.Distribution) -> set[str]:
    """The top-level module names a distribution installs."""
    listed = dist.read_text("top_level.txt")
    if listed:
        return {line.strip() for line in listed.splitlines() if line.strip()}
    names = set()
    for file in dist.files or ():
        first = file.parts[0] if file.parts else ""
        if first in ("..", "__pycache__") or first.endswith((".dist-info", ".egg-info", ".data")):
            continue
        if len(file.parts) == 1:  # a module or a .pth file at the top
            if first.endswith(".py"):
                names.add(first[: -len(".py")])
            continue
        names.add(first)
    return names


def _needed(requirement: str, extras: Iterable[str]) -> tuple[str, frozenset[str]] | None:
    """The name and extras of a requirement that applies with ``extras``, else None."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return None
    if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
        return None
    return req.name, frozenset(req.extras)


def wanted_top_levels(project: str = "substrat") -> frozenset[str] | None:
    """The top-level module names whose installed bytecode a test process can use; None
    (link everything, as before) when ``project`` is not installed or ``packaging`` is
    missing, so nothing can be told apart."""
    try:
        root = metadata.distribution(project)
        import packaging.requirements  # noqa: F401  (pytest's own dependency)
    except (metadata.PackageNotFoundError, ImportError):
        return None
    names = set(sys.stdlib_module_names)
    stdlib = sysconfig.get_path("stdlib")  # all of it: ``_sysconfigdata_*`` is not in the list
    if os.path.isdir(stdlib):
        names |= {name.partition(".")[0] for name in os.listdir(stdlib)}
    names |= {name.partition(".")[0] for name in list(sys.modules)}
    queue: list[tuple[metadata.Distribution, frozenset[str]]] = [
        (root, frozenset(root.metadata.get_all("Provides-Extra") or ()))
    ]
    for point in metadata.entry_points(group="pytest11"):
        if point.dist is not None:
            queue.append((point.dist, frozenset()))
    seen: set[tuple[str, frozenset[str]]] = set()
    while queue:
        dist, extras = queue.pop()
        key = (dist.metadata["Name"] or "", extras)
        if key in seen:
            continue
        seen.add(key)
        names |= top_levels(dist)
        for requirement in dist.requires or ():
            needed = _needed(requirement, extras | {""})
            if needed is None:
                continue
            try:
                queue.append((metadata.distribution(needed[0]), needed[1]))
            except metadata.PackageNotFoundError:
                continue
    return frozenset(names)
