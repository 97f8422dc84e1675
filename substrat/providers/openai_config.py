"""Settings and error classification for the ``openai`` provider.

Kept apart from the session code: this is what a user configures (the
environment variables and their limits) and how a failed request is judged
(retry it, report an overflow, or give up).
"""

from __future__ import annotations

import json
import os
import re
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from substrat.errors import ProviderConfigError

DEFAULT_MODEL = "gpt-4o-mini"
_OVERFLOW_PATTERN = re.compile(
    r"context[ _](length|window)|maximum context|too many tokens|prompt is too long"
    r"|reduce the length|exceeds? the (model'?s? )?(max|context)",
    re.IGNORECASE,
)
_TRANSIENT_STATUSES = frozenset({408, 409, 425, 429})
SETTINGS = (
    "SUBSTRAT_OPENAI_API_KEY",
    "OPENAI_API_KEY",
    "SUBSTRAT_OPENAI_BASE_URL",
    "OPENAI_BASE_URL",
)
"""Where the endpoint and its key come from (the daemon's environment)."""


@dataclass(frozen=True)
class OpenAIConfig:
    """Where the endpoint is and how hard to try. Every limit carries its unit."""

    base_url: str | None = None
    api_key: str | None = None
    default_model: str = DEFAULT_MODEL
    max_retries: int = 5  # extra attempts per request after the first
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 20.0
    request_timeout_s: float = 120.0  # per read of the response, not the whole stream
    connect_timeout_s: float = 10.0
    # Between two pieces of the answer: a proxy's keep-alive comments (OpenRouter
    # sends them while the model works) reset the read timeout but not this one.
    stall_timeout_s: float = 600.0
    max_tool_rounds_per_turn: int = 16

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.max_tool_rounds_per_turn < 1:
            raise ProviderConfigError(
                "openai: max_retries must be >= 0 and max_tool_rounds_per_turn >= 1"
            )
        if (
            min(self.backoff_base_s, self.backoff_cap_s) < 0
            or min(self.request_timeout_s, self.stall_timeout_s) <= 0
        ):
            raise ProviderConfigError("openai: backoff and timeout settings must be positive")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> OpenAIConfig:
        """Settings from the environment; ``SUBSTRAT_OPENAI_*`` beats ``OPENAI_*``."""
        env = os.environ if env is None else env

        def pick(*names: str) -> str | None:
            for name in names:
                if env.get(name):
                    return env[name]
            return None

        def number(name: str, kind: type[int] | type[float], default: Any) -> Any:
            raw = env.get(name)
            if not raw:
                return default
            try:
                return kind(raw)
            except ValueError:
                raise ProviderConfigError(
                    f"openai: {name}={raw!r} is not a valid {kind.__name__}; fix or unset it"
                ) from None

        base = cls()
        values: dict[str, Any] = {
            "base_url": pick("SUBSTRAT_OPENAI_BASE_URL", "OPENAI_BASE_URL"),
            "api_key": pick("SUBSTRAT_OPENAI_API_KEY", "OPENAI_API_KEY"),
            "default_model": pick("SUBSTRAT_OPENAI_MODEL") or base.default_model,
            "max_retries": number("SUBSTRAT_OPENAI_MAX_RETRIES", int, base.max_retries),
            "request_timeout_s": number("SUBSTRAT_OPENAI_TIMEOUT_S", float, base.request_timeout_s),
            "stall_timeout_s": number(
                "SUBSTRAT_OPENAI_STALL_TIMEOUT_S", float, base.stall_timeout_s
            ),
            "max_tool_rounds_per_turn": number(
                "SUBSTRAT_OPENAI_MAX_TOOL_ROUNDS", int, base.max_tool_rounds_per_turn
            ),
        }
        values.update(overrides)
        return cls(**values)


def endpoint_label(base_url: str | None) -> str:
    """The endpoint as errors show it and the log keeps it: without the user, password,
    query and fragment of the URL, which can hold credentials (a proxy's basic auth,
    an ``?api-key=``)."""
    if not base_url:
        return "api.openai.com"
    try:
        parts = urllib.parse.urlsplit(base_url)
    except ValueError:
        return "the configured base URL (unparsable)"
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def sdk() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise ProviderConfigError(
            "openai provider: the openai SDK is not installed; run `pip install 'substrat[openai]'`"
        ) from exc
    return openai


class BrokenStream(Exception):
    """The stream ended without a finish reason: the connection was cut."""


def classify(exc: BaseException) -> tuple[str, float | None]:
    """``("transient" | "overflow" | "permanent" | "untrusted" | "unknown", retry_after_s)``
    for an error; ``untrusted``: the endpoint's TLS certificate failed verification."""
    openai = sdk()
    if isinstance(exc, BrokenStream):
        return "transient", None
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        text = f"{exc.message} {exc.body}"
        if status in _TRANSIENT_STATUSES or status >= 500:
            return "transient", retry_after_s(exc.response.headers)
        if status == 413 or (status == 400 and _OVERFLOW_PATTERN.search(text)):
            return "overflow", None
        return "permanent", None
    if isinstance(exc, openai.APIConnectionError):  # timeouts included
        if isinstance(root_cause(exc), ssl.SSLCertVerificationError):
            return "untrusted", None  # the same certificate again will not do better
        return "transient", None
    if isinstance(exc, json.JSONDecodeError):  # a garbled event: a proxy's, a cut line
        return "transient", None
    if isinstance(exc, openai.APIError):  # an error event inside the stream
        return ("overflow" if _OVERFLOW_PATTERN.search(str(exc)) else "transient"), None
    return "unknown", None


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw:
            try:
                return max(0.0, float(raw) / divisor)
            except ValueError:
                return None
    return None


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception ``exc`` was raised from (``exc`` itself if none)."""
    seen = {id(exc)}
    while (inner := exc.__cause__ or exc.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        exc = inner
    return exc


def describe(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"the endpoint sent a stream event that is not JSON ({exc.msg})"
    status = getattr(exc, "status_code", None)
    prefix = f"HTTP {status}: " if status else f"{type(exc).__name__}: "
    text = prefix + (getattr(exc, "message", None) or str(exc) or "no detail")
    openai = sdk()
    if isinstance(exc, openai.APIConnectionError) and not isinstance(exc, openai.APITimeoutError):
        cause = root_cause(exc)  # the SDK says only "Connection error."
        if cause is not exc and str(cause):
            text += f" ({cause})"
    return text
