"""One thread of one process drives an orchestrator; a call from any other is refused.

An orchestrator's state (the tree, the inboxes, each log's ``seq`` counter and
its append position) is plain memory that its operations change between
awaits, on the assumption that one event loop runs them one step at a time.
Two threads calling into it (each with its own loop, or one through
``asyncio.run`` beside the loop that serves) interleave those steps: two
appends to one log take the same ``seq``, and the log repair of the next
open then drops acknowledged entries as duplicates. A forked child holds a
copy of the same memory and an inherited descriptor of the same log files,
and of the root's ``flock`` too (a lock belongs to the open file description
the fork shares), so the hold does not keep it out: its writes collide with
the parent's the same way.

So the orchestrator remembers the thread and process that made it (the caller
of ``Orchestrator.open``) and every public method checks them first, before
it reads or changes anything, as ``sqlite3`` refuses a connection used from
another thread. The check costs one ``threading.get_ident()`` and one
``os.getpid()`` per call.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from substrat.errors import WrongThreadError

API = (
    "ack_user_messages",
    "agents",
    "checkpoint",
    "close",
    "collect_user_inbox",
    "create_root",
    "evict",
    "get",
    "history",
    "history_and_gaps",
    "inspect",
    "lookup",
    "resume_roots",
    "roll_forward",
    "run_pending",
    "run_turn",
    "subscribe",
    "terminate",
    "tree_view",
    "user_inbox",
    "wake",
)
"""The orchestrator's public methods (docs/orchestrator.md): each checks its caller."""


class Owner:
    """The thread and process an orchestrator belongs to."""

    __slots__ = ("loop_check", "name", "pid", "thread")

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.name = threading.current_thread().name
        self.pid = os.getpid()
        self.loop_check: Callable[[str], None] | None = None
        """Called with the method's name at the start of every async method (after the
        thread's check): the multiplexer's, which refuses a second open event loop."""

    def check(self, method: str) -> None:
        """Raise WrongThreadError unless the caller is the owner's thread in its process."""
        if os.getpid() != self.pid:
            raise WrongThreadError(
                f"Orchestrator.{method} called in process {os.getpid()}, a child forked from "
                f"process {self.pid}, which opened the root: the child shares the parent's "
                "files and hold, so its writes would collide with the parent's. Nothing was "
                "done; open roots in the child only (another root, or this one once the parent "
                "has closed it), or ask the parent to do it"
            ).with_details(owner_pid=self.pid, pid=os.getpid())
        if threading.get_ident() != self.thread:
            raise WrongThreadError(
                f"Orchestrator.{method} called from thread "
                f"{threading.current_thread().name!r}; this orchestrator was opened in thread "
                f"{self.name!r} and is not thread-safe. Nothing was done; call it from that "
                "thread (from another one, hand the call to its event loop with "
                "asyncio.run_coroutine_threadsafe)"
            ).with_details(owner_thread=self.name)


def guard(cls: type, names: Iterable[str]) -> None:
    """Make each method ``names`` of ``cls`` check ``self.owner`` before it runs."""
    for name in names:
        setattr(cls, name, _guarded(getattr(cls, name), name))


def _guarded(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def checked_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            owner = self.owner
            owner.check(name)
            if owner.loop_check is not None:
                owner.loop_check(name)
            return await method(self, *args, **kwargs)

        return checked_async

    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.owner.check(name)
        return method(self, *args, **kwargs)

    return checked
