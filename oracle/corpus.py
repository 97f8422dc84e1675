"""Where the fuzzers' Hypothesis corpus lives.

Always in the local directory database ``.hypothesis/examples`` (relative to
the working directory, as Hypothesis itself does), so a nightly CI cache of
``.hypothesis/`` carries the corpus from one run to the next. When
``HYPOTHESIS_REDIS_URL`` is set, the same examples also go to a Redis server
and come back from it, so every xdist worker and every CI runner shares one
corpus: a failure found on one machine is replayed first on the others.

The Redis side needs the ``redis`` package (``pip install 'substrat[redis]'``).
Bad settings fail loudly here, at start-up, instead of as one error per test.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    MultiplexedDatabase,
)

REDIS_URL_ENV = "HYPOTHESIS_REDIS_URL"
LOCAL_EXAMPLES_DIR = Path(".hypothesis") / "examples"
REDIS_CONNECT_TIMEOUT_S = 5.0
# Bounds every Redis call a test makes, so a hung server fails a test instead of hanging it.
REDIS_SOCKET_TIMEOUT_S = 30.0
_REDIS_SCHEMES = ("redis", "rediss", "unix")


class CorpusConfigError(Exception):
    """The shared corpus is asked for but cannot be set up; the message says how to fix it."""


def redis_url_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The Redis URL to share the corpus through, or None when sharing is off."""
    env = os.environ if environ is None else environ
    url = env.get(REDIS_URL_ENV, "").strip()
    return url or None


def redact_url(url: str) -> str:
    """The URL with any password replaced, fit for error messages and logs."""
    return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)


def validate_redis_url(url: str) -> None:
    """Raise :class:`CorpusConfigError` unless ``url`` is a usable Redis URL."""
    shown = redact_url(url)
    hint = (
        f"set {REDIS_URL_ENV} to e.g. redis://127.0.0.1:6379/0, rediss://host:port/0 or "
        f"unix:///path/to/redis.sock, or unset it to keep the corpus local"
    )
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a non-numeric or out-of-range port
    except ValueError as exc:
        raise CorpusConfigError(f"{REDIS_URL_ENV}={shown!r} is malformed ({exc}); {hint}") from exc
    if parts.scheme not in _REDIS_SCHEMES:
        raise CorpusConfigError(
            f"{REDIS_URL_ENV}={shown!r} has scheme {parts.scheme!r}, not one of "
            f"{', '.join(_REDIS_SCHEMES)}; {hint}"
        )
    if parts.scheme == "unix":
        if not parts.path:
            raise CorpusConfigError(f"{REDIS_URL_ENV}={shown!r} names no socket path; {hint}")
        return
    if not parts.hostname:
        raise CorpusConfigError(f"{REDIS_URL_ENV}={shown!r} names no host; {hint}")
    if port == 0:
        raise CorpusConfigError(f"{REDIS_URL_ENV}={shown!r} has port 0; {hint}")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise CorpusConfigError(
            f"{REDIS_URL_ENV}={shown!r} selects database {db!r}; it must be a number; {hint}"
        )


def local_database(path: str | os.PathLike[str] = LOCAL_EXAMPLES_DIR) -> ExampleDatabase:
    """The per-checkout corpus directory (created by Hypothesis on first save)."""
    return DirectoryBasedExampleDatabase(path)


def redis_database(
    url: str,
    *,
    connect_timeout_s: float = REDIS_CONNECT_TIMEOUT_S,
    socket_timeout_s: float = REDIS_SOCKET_TIMEOUT_S,
    check_connection: bool = True,
) -> ExampleDatabase:
    """Hypothesis's Redis example database for ``url``.

    With ``check_connection`` the server is pinged once now, so an unreachable
    server is one clear error at start-up rather than an error in every test.
    """
    validate_redis_url(url)
    try:
        from hypothesis.extra.redis import RedisExampleDatabase
        from redis import Redis
        from redis.exceptions import RedisError
    except ImportError as exc:
        raise CorpusConfigError(
            f"{REDIS_URL_ENV} is set but the 'redis' package is not installed "
            f"({exc}); install it with pip install 'substrat[redis]' (or pip install redis), "
            f"or unset {REDIS_URL_ENV}"
        ) from exc
    shown = redact_url(url)
    options: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout_s,
        "socket_timeout": socket_timeout_s,
    }
    try:
        client = Redis.from_url(url, **options)
    except ValueError as exc:
        raise CorpusConfigError(f"{REDIS_URL_ENV}={shown!r} was refused: {exc}") from exc
    if check_connection:
        try:
            client.ping()
        except (RedisError, OSError) as exc:
            raise CorpusConfigError(
                f"{REDIS_URL_ENV}={shown!r}: no Redis answered within {connect_timeout_s} s "
                f"({exc}); start the server, fix the URL, or unset {REDIS_URL_ENV}"
            ) from exc
    return RedisExampleDatabase(client)


def example_database(environ: Mapping[str, str] | None = None) -> ExampleDatabase:
    """The database the profiles use: local directory, plus Redis when configured.

    Saves go to both; replays draw from both, so a machine with an empty
    ``.hypothesis/`` still starts from everything the others found.
    """
    local = local_database()
    url = redis_url_from_env(environ)
    if url is None:
        return local
    return MultiplexedDatabase(local, redis_database(url))
