"""substrat.dataclass_lazy: the standard library's dataclasses, their methods compiled on
first use. Every method must be, once used, what ``dataclasses.dataclass`` makes."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from substrat import dataclass_lazy
from substrat.dataclass_lazy import _Deferred, dataclass, field

DEFERS = dataclass_lazy._ORIGINAL is not None
needs_deferral = pytest.mark.skipif(not DEFERS, reason="this Python's dataclasses defer nothing")
SUBSTRAT = Path(dataclass_lazy.__file__).parent

METHODS = ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__", "__lt__")


def twins(body: str, decorator: str) -> tuple[type, type]:
    """The class ``body`` made by both decorators (``decorator``: the arguments)."""
    made = []
    for deco in (dataclass, dataclasses.dataclass):
        space: dict[str, Any] = {"field": field, "deco": deco, "Any": Any, "__name__": __name__}
        exec(f"@deco{decorator}\nclass C:\n{body}", space)  # same source, same globals
        made.append(space["C"])
    return made[0], made[1]


CASES = {
    "plain": ("", "    a: int\n    b: str = 'x'\n    c: list = field(default_factory=list)\n"),
    "frozen": ("(frozen=True)", "    a: int\n    b: tuple = ()\n"),
    "slots": ("(slots=True)", "    a: int\n    b: int = 2\n"),
    "frozen slots": ("(frozen=True, slots=True)", "    a: int\n    b: int = 2\n"),
    "no eq": ("(eq=False)", "    a: int\n"),
    "unsafe hash": (
        "(unsafe_hash=True)",
        "    a: int\n    b: int = field(default=0, hash=False)\n",
    ),
    "order": ("(order=True)", "    a: int\n    b: int = 0\n"),
    "kw only": ("(kw_only=True)", "    a: int\n    b: int = 1\n"),
    "not compared": ("", "    a: int\n    b: int = field(default=0, compare=False, repr=False)\n"),
    "post init": (
        "",
        "    a: int\n    b: int = field(init=False)\n"
        "    def __post_init__(self):\n        self.b = self.a * 2\n",
    ),
    "documented": ("", '    """Says what it is."""\n\n    a: int\n'),
    "own repr": ("", "    a: int\n    def __repr__(self):\n        return 'mine'\n"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_class_behaves_as_the_standard_librarys_before_and_after_first_use(case: str) -> None:
    decorator, body = CASES[case]
    lazy, eager = twins(body, decorator)
    params = eager.__dataclass_params__
    assert repr(lazy.__dataclass_params__) == repr(params)
    assert [repr(f) for f in dataclasses.fields(lazy)] == [
        repr(f) for f in dataclasses.fields(eager)
    ]
    # first uses: the signature (through Class.__init__), then instances
    assert str(inspect.signature(lazy)) == str(inspect.signature(eager))
    assert lazy.__doc__ == eager.__doc__
    kw = {"kw_only": True}.get(case.replace(" ", "_"))
    args: tuple[Any, ...] = () if kw else (3,)
    kwargs = {"a": 3} if kw else {}
    x, y, other = lazy(*args, **kwargs), lazy(*args, **kwargs), eager(*args, **kwargs)
    assert repr(x) == repr(other).replace(eager.__qualname__, lazy.__qualname__)
    assert (x == y) == (other == eager(*args, **kwargs))
    assert x != other  # another class: NotImplemented both ways, as the standard one
    assert (eager.__hash__ is None) == (lazy.__hash__ is None)
    if eager.__hash__ is not None and "__hash__" in eager.__dict__:
        assert hash(x) == hash(other)
    if params.order:
        assert not x < y and x <= y
    if params.frozen:
        with pytest.raises(dataclasses.FrozenInstanceError):
            x.a = 4  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            del x.a  # type: ignore[misc]
    else:
        x.a = 4
        assert x != y
    assert dataclasses.replace(y, a=5).a == 5
    assert dataclasses.asdict(y) == dataclasses.asdict(other)
    if params.eq:
        assert copy.deepcopy(y) == y
    for name in METHODS:  # every method on the class is now the compiled one
        assert not isinstance(lazy.__dict__.get(name), _Deferred), name


@needs_deferral
def test_defining_a_class_compiles_nothing_and_a_first_use_compiles_once() -> None:
    # documented: a class without a docstring gets its signature as one, which needs
    # its __init__ compiled at once (as the standard decorator does)
    lazy, _ = twins('    """A pair."""\n\n    a: int\n    b: int = 0\n', "(frozen=True)")
    deferred = {n for n in METHODS if isinstance(lazy.__dict__.get(n), _Deferred)}
    assert deferred == {"__init__", "__eq__", "__hash__", "__setattr__", "__delattr__"}
    repr_guard = lazy.__dict__["__repr__"]
    assert isinstance(repr_guard.__wrapped__, _Deferred)
    x = lazy(1)
    init = lazy.__dict__["__init__"]
    assert inspect.isfunction(init) and init.__qualname__ == "C.__init__"
    assert lazy(2).a == 2 and lazy.__dict__["__init__"] is init  # compiled once
    assert repr(x) == "C(a=1, b=0)"
    assert inspect.isfunction(repr_guard.__wrapped__)  # the guard holds the method now
    assert isinstance(lazy.__dict__["__eq__"], _Deferred)  # not used yet, not compiled


@needs_deferral
def test_a_recursive_repr_is_guarded_as_the_standard_librarys() -> None:
    lazy, eager = twins("    a: Any = None\n", "")
    x, y = lazy(), eager()
    x.a, y.a = [x], [y]
    assert repr(x) == "C(a=[...])" == repr(y)


@needs_deferral
def test_a_subclass_and_super_find_the_method_where_it_is_defined() -> None:
    lazy, _ = twins("    a: int\n", "")

    class Sub(lazy):  # type: ignore[misc,valid-type]
        def __eq__(self, other: object) -> bool:
            return bool(super().__eq__(other))

    assert Sub(1) == Sub(1) and Sub(1) != Sub(2)
    assert inspect.isfunction(lazy.__dict__["__eq__"]) and "__eq__" in Sub.__dict__
    assert lazy.__dict__["__eq__"].__qualname__ == "C.__eq__"


def test_every_module_of_substrat_takes_dataclass_from_here() -> None:
    # the standard decorator, imported anew somewhere, would compile its class's methods
    # at every start again
    plain = re.compile(r"^from dataclasses import .*\bdataclass\b|@dataclasses\.dataclass", re.M)
    found = [
        str(path.relative_to(SUBSTRAT))
        for path in sorted(SUBSTRAT.rglob("*.py"))
        if path.name != "dataclass_lazy.py" and plain.search(path.read_text())
    ]
    assert found == []


DESCRIBE = r"""
import dataclasses, importlib, inspect, json, pkgutil, sys
import substrat
if sys.argv[1] == "eager":
    from substrat import dataclass_lazy
    dataclass_lazy._ORIGINAL = None  # the standard library's decorator, as it is
for info in pkgutil.walk_packages(substrat.__path__, "substrat."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)

def code(c):
    consts = [code(k) if hasattr(k, "co_code") else repr(k) for k in c.co_consts]
    return [c.co_qualname, c.co_code.hex(), consts, c.co_names, c.co_varnames,
            c.co_freevars, c.co_argcount, c.co_kwonlyargcount, c.co_flags]

def function(f):
    cells = [repr(c.cell_contents) for c in f.__closure__ or ()]
    return [f.__name__, f.__qualname__, f.__module__, f.__doc__, repr(f.__defaults__),
            repr(f.__kwdefaults__), repr(f.__annotations__), code(f.__code__), cells]

out = {}
for module in list(sys.modules.values()):
    for cls in list(vars(module).values()) if module.__name__.startswith("substrat") else ():
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            continue
        if cls.__module__ != module.__name__:
            continue
        said = {"doc": cls.__doc__, "signature": str(inspect.signature(cls))}
        for name in %(methods)r:
            if name in cls.__dict__:
                method = getattr(cls, name)  # compiles what was deferred
                inner = getattr(method, "__wrapped__", None)
                if inner is not None and not inspect.isfunction(inner):
                    inner.compiled()  # deferred: the guard holds the method once it ran
                    inner = method.__wrapped__
                said[name] = None if method is None else function(method)
                if inner is not None:
                    said[name + " wraps"] = function(inner)
        out[cls.__module__ + "." + cls.__qualname__] = said
print(json.dumps(out, sort_keys=True, default=repr))
"""


def describe(mode: str) -> dict[str, Any]:
    probe = DESCRIBE % {"methods": METHODS}
    done = subprocess.run(
        [sys.executable, "-c", probe, mode], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    described: dict[str, Any] = json.loads(done.stdout)
    return described


@needs_deferral
def test_every_substrat_dataclass_compiles_to_the_standard_librarys_methods() -> None:
    # Every module of substrat imported, every method of every dataclass looked up (and so
    # compiled): names, defaults, annotations and bytecode as the standard decorator's.
    lazy, eager = describe("lazy"), describe("eager")
    assert len(eager) > 60  # all of them, not a few
    addresses = re.compile(r" at 0x[0-9a-f]+")
    assert addresses.sub("", json.dumps(lazy)) == addresses.sub("", json.dumps(eager))


COMPILES = r"""
import dataclasses, json, sys
made = []
original = dataclasses._create_fn
def counting(name, args, body, *, globals=None, **kwargs):
    if (globals or {}).get("__name__", "").startswith("substrat"):
        made.append(globals["__name__"] + " " + name)
    return original(name, args, body, globals=globals, **kwargs)
dataclasses._create_fn = counting  # before substrat: what its classes compile is counted
import substrat.daemon, substrat.orchestrator, substrat.recovery
print(json.dumps(made))
"""


@pytest.mark.skipif(not hasattr(dataclasses, "_create_fn"), reason="no per-method compiler")
def test_the_daemons_modules_compile_no_dataclass_method_as_they_load() -> None:
    # A daemon start defines 56 dataclasses, and compiling their 223 generated methods
    # one by one was a sixth of its CPU. Only what is used is compiled now: here, the
    # __init__ of the instances made at import (checkpointer.DEFAULT_POLICY, the tools'
    # ToolSpecs), nothing else.
    done = subprocess.run(
        [sys.executable, "-c", COMPILES], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert sorted(made) == ["substrat.checkpointer __init__", "substrat.providers.base __init__"]
