"""A misspelled keyword argument of a public entry point: a ConfigError with the fix.

Python's own error ("got an unexpected keyword argument 'mode'") names neither
the intended option nor the accepted ones; every public function and method of
faultfs that takes options says both, as the fixtures and the machine do.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

from faultfs.errors import ConfigError

P = ParamSpec("P")
R = TypeVar("R")

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def unknown_argument(where: str, name: str, value: Any, accepted: Iterable[str]) -> ConfigError:
    """``where`` takes no argument ``name``: the closest accepted one, then all of them."""
    names = sorted(accepted)
    close = difflib.get_close_matches(name, names, n=1)
    meant = f"did you mean {close[0]}={value!r}? It" if close else "it"
    return ConfigError(f"{where} takes no argument {name!r}; {meant} takes {', '.join(names)}")


def accepted_names(function: Callable[..., Any]) -> list[str]:
    """The names ``function`` accepts as keyword arguments (``self`` and ``cls`` left out)."""
    return [
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind in _NAMED and name not in ("self", "cls")
    ]


def checked(function: Callable[P, R]) -> Callable[P, R]:
    """``function``, where an unknown keyword argument raises :func:`unknown_argument`'s error.

    Nothing is checked on a call that binds: the error is looked into only when the
    call itself raised TypeError before running the body (no frame below this one).
    """
    accepted = accepted_names(function)
    where = f"{function.__qualname__.replace('.__init__', '')}()"

    @functools.wraps(function)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except TypeError as exc:
            tb = exc.__traceback__
            if tb is None or tb.tb_next is not None:
                raise  # raised inside the body: not about the arguments
            for name, value in kwargs.items():
                if name not in accepted:
                    raise unknown_argument(where, name, value, accepted) from None
            raise

    return call
