"""Every exception a substrat user can meet, each with a message that says what to do."""

from __future__ import annotations


class SubstratError(Exception):
    """Base class of substrat's own errors."""


class DurabilityError(SubstratError, OSError):
    """A write or fsync failed: the operation was NOT acknowledged.

    After a failed fsync the kernel may already have dropped the dirty pages, so
    retrying the fsync would report success for data that is gone. The caller
    must treat the operation as lost; reopen the log (which repairs it) before
    writing again.
    """


class LogClosedError(SubstratError):
    """The event log was closed, or poisoned by a failed write; reopen it."""


class EntryTooLargeError(SubstratError, ValueError):
    """An event-log entry is over the size limit; store large payloads elsewhere."""


class InvalidSessionIdError(SubstratError, ValueError):
    """A session id is not a 32-character lowercase hex UUID."""


class InvalidTransitionError(SubstratError):
    """A session state change that the lifecycle does not allow."""


class SessionNotFoundError(SubstratError, KeyError):
    """No session record with that id exists under the root."""


class CorruptRecordError(SubstratError):
    """A session record could not be read; it is quarantined, the rest load."""


class AgentError(SubstratError):
    """An agent operation was refused (unknown agent, bad name, wrong state)."""


class AgentNotFoundError(AgentError, KeyError):
    """No live agent with that id or path; `substrat agent list` shows the live ones."""


class NameCollisionError(AgentError):
    """A sibling with that name already exists; pick another name."""


class AgentBusyError(AgentError):
    """The agent is running a turn; one turn at a time per agent. Retry when it is idle."""


class HasChildrenError(AgentError):
    """The agent still has live children; terminate them first or pass cascade=True."""


class ProviderError(SubstratError):
    """The provider failed; the turn is logged as failed and nothing was acknowledged."""


class UnknownProviderError(ProviderError, KeyError):
    """No provider by that name; `substrat providers` lists the registered ones."""


class ProviderConfigError(ProviderError):
    """A provider is not set up (no API key, no base URL, CLI binary or SDK missing).

    The message names the setting or install step that fixes it; nothing was sent.
    """


class ProviderUnavailableError(ProviderError):
    """The backend kept failing transiently (rate limits, 5xx, timeouts, dropped
    connections) past the retry budget. Nothing of the turn was acknowledged;
    send the prompt again later."""


class ProviderRejectedError(ProviderError):
    """The backend refused the request permanently (a 4xx other than 429).

    Retrying the same request will fail again; the message carries the
    backend's own explanation.
    """


class ContextOverflowError(ProviderRejectedError):
    """The conversation no longer fits the model's context window.

    Start a fresh agent (or one with a larger-context model) and hand it a
    summary; this agent's conversation cannot grow further.
    """


class ToolError(SubstratError):
    """A tool call was refused; the message says why and goes back to the agent."""


class RootLockedError(SubstratError):
    """Another daemon holds the root's lock; stop it or use another root."""


class RootPermissionError(SubstratError, PermissionError):
    """The root is owned by another user or cannot be made private (mode 0700)."""


class DaemonError(SubstratError):
    """Talking to the daemon failed; `substrat daemon status` says whether it runs."""


class DaemonNotRunningError(DaemonError):
    """No daemon answers on the root's socket; start one with `substrat daemon start`."""


class DaemonStartError(DaemonError):
    """The daemon did not come up; its log (``<root>/daemon.log``) says why."""


class DaemonDiedError(DaemonError):
    """The daemon closed the connection before answering; it may have crashed.

    The request may or may not have been applied: check with `substrat agent list`
    or `substrat log` after `substrat daemon start` has recovered the root.
    """


class RequestTimeoutError(DaemonError, TimeoutError):
    """The daemon did not answer in time; raise ``--timeout`` or check its log."""


class SocketPathTooLongError(DaemonError, ValueError):
    """The socket path does not fit a Unix socket address; use a shorter root path."""


class RpcError(DaemonError):
    """The daemon answered a request with a JSON-RPC error.

    ``code`` is the JSON-RPC error code (docs/rpc.md lists them), ``data`` the
    error's extra detail (``data["type"]`` names the daemon-side exception).
    """

    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class FsckError(SubstratError):
    """fsck could not run on this root (no root there, a daemon holds it, an I/O error)."""
