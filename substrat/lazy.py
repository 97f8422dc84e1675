"""A dict some of whose values are built when first asked for.

A start from the start summary (:mod:`substrat.start_summary`) has thousands of quiet
agents, most of which nothing asks about before they are used again: their tree node,
session record and turn counters are kept as the summary's row (the *source*) and
built from it on first use (see :mod:`substrat.recovery_quiet`). :class:`LazyDict`
holds both: a key is in it, counted in its length and seen by every iteration whether
its value is built or not; reading a value (``d[key]``, :meth:`get`, :meth:`pop`)
builds that one value; anything that goes over the values (``items()``,
``values()``, iteration, equality, a copy) builds every one first, so a caller that
asks for everything gets exactly what an eager start builds. ``dict``'s own C methods
that would see only the built part (``copy``, ``setdefault``, ``update``, ``==``,
``popitem``) are overridden; :meth:`unbuilt` tells how many are still rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _collections_abc import dict_items, dict_keys, dict_values

K = TypeVar("K")
V = TypeVar("V")

_NOTHING: Any = object()


class LazyDict(dict[K, V]):
    """``dict`` whose values under ``sources`` are ``build(key, source)`` on first use."""

    __slots__ = ("_build", "_sources")

    def __init__(
        self,
        built: Iterable[tuple[K, V]] | dict[K, V] = (),
        sources: dict[K, Any] | None = None,
        build: Callable[[K, Any], V] | None = None,
    ) -> None:
        super().__init__(built)
        self._sources: dict[K, Any] = {} if sources is None else sources
        self._build = build
        # the views compare in C, over the smaller side (the built part, at a start)
        if dict.__len__(self) and not self._sources.keys().isdisjoint(dict.keys(self)):
            raise ValueError("a key is both built and a source")

    # -- one value -------------------------------------------------------------

    def _take(self, key: K) -> V:
        source = self._sources.pop(key)
        assert self._build is not None, "a source with nothing to build it"
        value = self._build(key, source)
        dict.__setitem__(self, key, value)
        return value

    def __missing__(self, key: K) -> V:
        if key in self._sources:
            return self._take(key)
        raise KeyError(key)

    def get(self, key: K, default: Any = None) -> Any:
        value = dict.get(self, key, _NOTHING)
        if value is not _NOTHING:
            return value
        if key in self._sources:
            return self._take(key)
        return default

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or key in self._sources

    def __len__(self) -> int:
        return dict.__len__(self) + len(self._sources)

    def __setitem__(self, key: K, value: V) -> None:
        if self._sources:
            self._sources.pop(key, None)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: K) -> None:
        if key in self._sources:
            del self._sources[key]
        else:
            dict.__delitem__(self, key)

    def pop(self, key: K, default: Any = _NOTHING) -> Any:
        if key in self._sources:
            self._take(key)
        if default is _NOTHING:
            return dict.pop(self, key)
        return dict.pop(self, key, default)

    def setdefault(self, key: K, default: Any = None) -> Any:
        if key in self:
            return self[key]
        self[key] = default
        return default

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def clear(self) -> None:
        self._sources.clear()
        dict.clear(self)

    def add_source(self, key: K, source: Any) -> None:
        """``key``'s value is ``build(key, source)`` when first asked for."""
        if dict.__contains__(self, key):
            raise ValueError(f"{key!r} is built already")
        self._sources[key] = source

    def add_sources(self, sources: dict[K, Any]) -> None:
        """:meth:`add_source` of each key -> source (ValueError if any is built: none added)."""
        if not sources.keys().isdisjoint(dict.keys(self)):
            raise ValueError("a key is built already")
        self._sources.update(sources)

    def is_source(self, key: object) -> bool:
        """Whether ``key``'s value is not built yet (asking builds nothing)."""
        return key in self._sources

    def sources_copy(self) -> dict[K, Any]:
        """Key -> source, of every value not built yet."""
        return dict(self._sources)

    def sources(self) -> dict[K, Any]:
        """Key -> source, of every value not built yet: the map itself, to read only."""
        return self._sources

    def source(self, key: K) -> Any:
        """What ``key``'s value will be built of (None: built, or no such key)."""
        return self._sources.get(key)

    # -- every value -----------------------------------------------------------

    def built_values(self) -> list[V]:
        """The values built so far (none is built by asking)."""
        return list(dict.values(self))

    def unbuilt(self) -> int:
        """How many values are still sources."""
        return len(self._sources)

    def built_keys(self) -> list[K]:
        """The keys whose values are built (none is built by asking)."""
        return list(dict.keys(self))

    def all_keys(self) -> list[K]:
        """Every key, built or not, none built by asking (built ones first)."""
        return [*dict.keys(self), *self._sources]

    def build_all(self) -> None:
        for key in list(self._sources):
            self._take(key)

    def __iter__(self) -> Iterator[K]:
        self.build_all()
        return dict.__iter__(self)

    def __reversed__(self) -> Iterator[K]:
        self.build_all()
        return dict.__reversed__(self)

    def keys(self) -> dict_keys[K, V]:
        self.build_all()
        return dict.keys(self)

    def values(self) -> dict_values[K, V]:
        self.build_all()
        return dict.values(self)

    def items(self) -> dict_items[K, V]:
        self.build_all()
        return dict.items(self)

    def popitem(self) -> tuple[K, V]:
        self.build_all()
        return dict.popitem(self)

    def copy(self) -> dict[K, V]:
        return dict(self.items())

    def __eq__(self, other: object) -> bool:
        self.build_all()
        if isinstance(other, LazyDict):
            other.build_all()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None

    def __repr__(self) -> str:
        self.build_all()
        return f"{type(self).__name__}({dict.__repr__(self)})"

    def __reduce__(self) -> Any:
        return (dict, (dict(self.items()),))

    def __or__(self, other: Any) -> dict[K, V]:  # type: ignore[override]
        return {**self.copy(), **other}

    def __ror__(self, other: Any) -> dict[K, V]:  # type: ignore[override]
        return {**other, **self.copy()}

    def __ior__(self, other: Any) -> LazyDict[K, V]:  # type: ignore[override]
        self.update(other)
        return self
