"""Every exception a substrat user can meet, each with a message that says what to do."""

from __future__ import annotations

from typing import Any, Self


class SubstratError(Exception):
    """Base class of substrat's own errors.

    ``details`` holds plain-JSON facts about the error (the agent's path, its
    children, ...) so that each front end can word the remedy in its own terms;
    the daemon sends them as the JSON-RPC error's ``data``.
    """

    details: dict[str, Any] = {}

    def with_details(self, **details: Any) -> Self:
        """Attach facts for front ends; returns the error, for ``raise X(...).with_details()``."""
        self.details = {**self.details, **details}
        return self


class _LookupError(KeyError):
    """A KeyError whose text is its message, not the repr ``KeyError`` gives it.

    ``str(KeyError("no agent x"))`` is ``"'no agent x'"``: those quotes would
    reach the user's terminal.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class DurabilityError(SubstratError, OSError):
    """A write or fsync failed before the operation's commit point: it did NOT happen.

    After a failed fsync the kernel may already have dropped the dirty pages, so
    retrying the fsync would report success for data that is gone. A failed
    event-log append is taken back durably before this is raised, so the
    operation stays undone, also after a crash. Reopen the log (which repairs
    it) before writing again.
    """


REOPEN_NOTE = "(reopen the log before writing again)"
"""How a failed append's DurabilityError ends (substrat.eventlog): what its library caller
must do. The daemon reopens a log itself, so its answer says what an operator does instead
(``OPERATOR_NOTE``, substrat.rpc.protocol)."""
OPERATOR_NOTE = "(nothing acknowledged is lost; try again once that is fixed)"


class OutcomeUnknownError(DurabilityError):
    """A write failed where its outcome cannot be known: the operation may have happened.

    Either taking a failed commit record back failed too (a crash may keep it),
    or the operation had committed and a later step failed. Treat it as
    undecided, like an operation cut by a crash: restart the daemon (recovery
    settles it), then `substrat log` / `substrat agent list` tell which.
    """


class OrchestratorClosedError(SubstratError):
    """The orchestrator was closed (its hold on the root given back): open the root again."""


class WrongLoopError(SubstratError, RuntimeError):
    """An orchestrator was called in an event loop while another one it waits in is open.

    asyncio binds what a wait uses to one loop. A loop that ``asyncio.run`` has closed
    is let go; one still open (``new_event_loop`` beside ``asyncio.run``) may yet run
    waiters. Nothing was done; drive an orchestrator from one loop.
    """


class WrongThreadError(SubstratError, RuntimeError):
    """An orchestrator was called from a thread or a forked process other than its opener's.

    It is not thread-safe: two threads (or a parent and its forked child) driving
    one would give two appends to a log the same ``seq``, and a later repair would
    drop acknowledged entries as duplicates. Nothing was done; call it from the
    thread that opened it (``asyncio.run_coroutine_threadsafe`` to its loop).
    """


class LogClosedError(SubstratError):
    """The event log was closed, or poisoned by a failed write; reopen it."""


class EntryTooLargeError(SubstratError, ValueError):
    """An event-log entry is over the size limit; store large payloads elsewhere."""


class InvalidSessionIdError(SubstratError, ValueError):
    """A session id is not a 32-character lowercase hex UUID."""


class InvalidTransitionError(SubstratError):
    """A session state change that the lifecycle does not allow."""


class SessionNotFoundError(SubstratError, _LookupError):
    """No session record with that id exists under the root."""


class CorruptRecordError(SubstratError):
    """A session record could not be read; it is quarantined, the rest load."""


class AgentError(SubstratError):
    """An agent operation was refused (unknown agent, bad name, wrong state)."""


class AgentNotFoundError(AgentError, _LookupError):
    """No live agent with that id, path or id prefix; `substrat agent list` shows the live ones."""


class AmbiguousAgentError(AgentNotFoundError):
    """An id prefix that more than one agent's id starts with; the message lists them."""


class AgentTerminatedError(AgentError):
    """The agent was terminated: its log is kept (``show`` and ``log`` read it), nothing runs."""


class NameCollisionError(AgentError):
    """A sibling with that name already exists; pick another name."""


class AgentBusyError(AgentError):
    """The agent is running a turn; one turn at a time per agent. Retry when it is idle."""


class HasChildrenError(AgentError):
    """The agent still has live children; terminate them first or pass cascade=True.

    Its ``details`` (``agent``, ``children``: paths) let a front end say it in
    its own terms (the CLI: ``--cascade``).
    """


class ProviderError(SubstratError):
    """The provider failed; the turn is logged as failed and nothing was acknowledged."""


class UnknownProviderError(ProviderError, _LookupError):
    """No provider by that name; the message lists the registered ones."""


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


class RootRegistryError(SubstratError):
    """The root registry (``roots/events.jsonl``) cannot be read or written, so no root
    agent can be created; stop the daemon, run `substrat fsck --repair`, start it again."""


class RootError(SubstratError):
    """The root cannot be used for this command; nothing was written. Every command exits 2."""


class NotARootError(RootError):
    """No substrat root there: nothing, an empty directory, or a directory substrat did not make.

    Commands that only read never create a root; ``substrat daemon start`` or
    ``substrat agent create`` does, in a new or empty private directory.
    """


class RootUnusableError(RootError):
    """The root is not a directory, or cannot be read or written (read-only, permissions)."""


class NestedRootError(RootUnusableError):
    """The path is inside another substrat root: a root there would be taken for that
    root's damage (and moved by its ``fsck --repair``) or written into by it."""


class RootPermissionError(RootError, PermissionError):
    """The root is owned by another user, or is an empty directory open to others."""


class DaemonError(SubstratError):
    """Talking to the daemon failed; `substrat daemon status` says whether it runs."""


class DaemonNotRunningError(DaemonError):
    """No daemon answers on the root's socket; start one with `substrat daemon start`."""


class DaemonUnreachableError(DaemonNotRunningError):
    """A live daemon serves the root but its socket (or lock file) was removed by hand: it
    will never answer there. `substrat daemon restart` makes them again."""


class DaemonStoppedUncleanlyError(DaemonError):
    """The daemon exited while stopping without its clean shutdown; the next start recovers."""


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


class BadInputError(SubstratError, ValueError):
    """A command's input was refused before anything was sent (an empty or oversized prompt)."""


class FsckError(SubstratError):
    """fsck could not run on this root (no root there, a daemon holds it, an I/O error)."""
