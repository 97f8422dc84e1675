"""``dataclass`` whose generated methods are compiled when first used.

On Python 3.11 and 3.12, :func:`dataclasses.dataclass` writes each method it adds
(``__init__``, ``__repr__``, ``__eq__``, and ``__setattr__``, ``__delattr__``,
``__hash__`` when frozen) as source text and compiles it with ``exec``, one method
at a time, while the class is defined. A daemon defines about 56 dataclasses before
its first answer, and those compiles were about 28 ms of its 150 ms of start-up CPU
(issue 17); a CLI command defines 5. Most of the methods are never called in a
process's life (a ``__repr__``, the ``__eq__`` of a report, the ``__init__`` of a
damage record).

:func:`dataclass` here runs the standard library's own decorator with one change: each
method's text is kept, not compiled, in a :class:`_Deferred` descriptor standing where
the method goes. The first time anything looks the method up (a call, ``repr(x)``,
``x == y``, ``hash(x)``, ``Class.__init__``, ``inspect.signature(Class)``), the
descriptor compiles that same text with the standard library's own function, puts the
result on the class in its place (so later calls cost what they did) and answers with
it. What is compiled, and so every method's behaviour, is exactly what
:func:`dataclasses.dataclass` makes (``tests/unit/test_dataclass_lazy.py`` compares the
compiled code of every Substrat dataclass with the standard library's). What differs is
what a raw look at the class's ``__dict__`` sees before a first use (the descriptor),
and ``__wrapped__`` of a ``__repr__`` (the descriptor, which calls the method).

On any other Python (3.13 compiles a class's methods in one go, and its internals
differ) this is :func:`dataclasses.dataclass` itself.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Callable
from dataclasses import field as field  # re-exported: the modules import both from here
from typing import TYPE_CHECKING, Any

__all__ = ["dataclass", "field"]

_ORIGINAL: Callable[..., Any] | None = (
    getattr(dataclasses, "_create_fn", None) if sys.version_info < (3, 13) else None
)
"""The standard library's method compiler (None where this module defers nothing)."""

_LOCK = threading.RLock()
"""One class at a time swaps the compiler in (the swap is the dataclasses module's)."""


class _Deferred:
    # A generated method not compiled yet: the arguments of ``dataclasses._create_fn``.
    # No docstring and no ``__dict__``: ``functools.wraps`` (``__repr__``'s recursion
    # guard) copies ``__name__``, ``__qualname__``, ``__doc__`` and ``__dict__`` from
    # what it wraps, and must find what it finds on the compiled method.

    __slots__ = ("__name__", "__qualname__", "_fn", "_guard", "_make", "_module")

    def __init__(self, name: str, make: tuple[Any, ...], module: str | None) -> None:
        self.__name__ = name
        # the compiled function's own until dataclasses names it after its class
        self.__qualname__ = f"__create_fn__.<locals>.{name}"
        self._module = module
        self._make = make
        self._fn: Any = None
        self._guard: Any = None  # the recursion guard that calls it (``__repr__``)

    def compiled(self) -> Any:
        """The method, compiled from its kept text on the first call."""
        fn = self._fn
        if fn is None:
            # two threads may both compile it: the same text, the same method either way
            # (the text is kept for that: no half-cleared state to find)
            assert _ORIGINAL is not None
            name, args, body, kwargs = self._make
            fn = self._fn = _ORIGINAL(name, args, body, **kwargs)
            if self._guard is not None:  # the guard calls the method itself from now on
                self._guard.__wrapped__ = fn
                for cell in self._guard.__closure__:
                    if cell.cell_contents is self:
                        cell.cell_contents = fn
        return fn

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        fn = self.compiled()
        for cls in (owner if owner is not None else type(obj)).__mro__:
            if cls.__dict__.get(self.__name__) is self:
                # named and placed as dataclasses would have: the class's own from now on
                fn.__qualname__ = f"{cls.__qualname__}.{self.__name__}"
                setattr(cls, self.__name__, fn)
                break
        return fn.__get__(obj, owner)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # called, not looked up: ``__repr__``'s recursion guard holds this, not the method
        return self.compiled()(*args, **kwargs)


def _defer(
    name: str,
    args: Any,
    body: Any,
    *,
    globals: dict[str, Any] | None = None,
    locals: dict[str, Any] | None = None,
    return_type: Any = dataclasses.MISSING,
) -> _Deferred:
    kwargs = {"globals": globals, "locals": locals, "return_type": return_type}
    module = globals.get("__name__") if globals is not None else None
    return _Deferred(name, (name, args, body, kwargs), module)


def _lazily(cls: type, params: dict[str, Any]) -> Any:
    if _ORIGINAL is None:
        return dataclasses.dataclass(cls, **params)
    with _LOCK:
        dataclasses._create_fn = _defer  # type: ignore[attr-defined]
        try:
            made: Any = dataclasses.dataclass(cls, **params)
        finally:
            dataclasses._create_fn = _ORIGINAL  # type: ignore[attr-defined]
    guard = made.__dict__.get("__repr__")
    deferred = getattr(guard, "__wrapped__", None)
    if isinstance(deferred, _Deferred):
        guard.__module__ = deferred._module  # functools.wraps copied this module's name
        deferred._guard = guard
    return made


if TYPE_CHECKING:
    from dataclasses import dataclass as dataclass  # what type checkers know to read
else:

    def dataclass(cls=None, /, **params):
        """:func:`dataclasses.dataclass` (same arguments), its methods compiled on first use."""
        if cls is None:
            return lambda cls: _lazily(cls, params)
        return _lazily(cls, params)
