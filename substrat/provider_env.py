"""Which endpoint and key the daemon's providers use, kept as a fingerprint.

Providers read their settings from the daemon's environment. A daemon that a
command starts on demand (after a crash, say) gets the environment of the
shell that ran the command, and that shell may point at another endpoint or
hold another key: every agent's whole conversation would then go there,
without a word. So the daemon keeps a fingerprint of its settings in its lock
record, and an on-demand start from a shell whose settings differ is refused;
an explicit ``substrat daemon start`` (or ``restart``) decides.

The fingerprint is a hash: the record never holds a key or a URL.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from substrat.rpc import lock

# Each group is one setting: its first name that is set wins (as the provider reads it).
SETTINGS = (
    ("SUBSTRAT_OPENAI_BASE_URL", "OPENAI_BASE_URL"),
    ("SUBSTRAT_OPENAI_API_KEY", "OPENAI_API_KEY"),
)


def effective(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings a daemon started with ``env`` would use, by their group's first name."""
    env = os.environ if env is None else env
    found = {}
    for names in SETTINGS:
        for name in names:
            if env.get(name):
                found[names[0]] = env[name]
                break
    return found


def fingerprint(env: Mapping[str, str] | None = None) -> str | None:
    """A short hash of :func:`effective`; None when no provider setting is set."""
    values = effective(env)
    if not values:
        return None
    import hashlib  # OpenSSL's library: loaded only by a shell with provider settings

    return hashlib.sha256(json.dumps(sorted(values.items())).encode()).hexdigest()[:16]


def kept(previous: lock.LockInfo | None, env: Mapping[str, str] | None = None) -> str | None:
    """The fingerprint a daemon started with ``env`` keeps in its records.

    Its own, or, when it has no provider settings at all, the last daemon's: the
    agents' endpoint is still that one, and a later on-demand start is compared with it.
    """
    return fingerprint(env) or (None if previous is None else previous.provider_env)


def autostart_refusal(
    root: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> str | None:
    """Why a command must not start the daemon of ``root`` from ``env``; None if it may.

    It may when the last daemon kept no fingerprint, when ``env`` sets no provider
    setting (a provider then has no endpoint to send anything to, and says so), or
    when the settings are the same.
    """
    info = lock.read_info(root)
    previous = None if info is None else info.provider_env
    current = fingerprint(env)
    if previous is None or current is None or previous == current:
        return None
    from substrat.providers.openai_config import endpoint_label  # the CLI's start stays light

    base_url = effective(env).get("SUBSTRAT_OPENAI_BASE_URL")
    return (
        f"no daemon runs on {Path(root)}, and this shell's openai settings (endpoint "
        f"{endpoint_label(base_url)}, and its key) are not the last daemon's: a daemon "
        "started from here would send the agents' conversations there. Start it from the "
        "agents' environment with `substrat daemon start`, or run `substrat daemon start` "
        "here to move them to this shell's settings"
    )
