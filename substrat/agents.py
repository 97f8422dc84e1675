"""Agents in memory: nodes, the tree, messages and inboxes.

Nothing here touches the disk. The durable truth is the event log; these
structures are what the orchestrator keeps while running and what recovery
rebuilds from the logs.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Any

from substrat.agent_names import MAX_NAME_CHARS as MAX_NAME_CHARS
from substrat.agent_names import NAME as _NAME
from substrat.agent_names import PARENT as PARENT
from substrat.agent_names import RESERVED as _RESERVED
from substrat.agent_names import USER as USER
from substrat.agent_names import validate_name as validate_name
from substrat.agent_refs import ambiguous, did_you_mean, id_prefix_matches, too_short_note
from substrat.errors import AgentNotFoundError, NameCollisionError
from substrat.lazy import LazyDict
from substrat.words import natural_key


def _by_name(item: tuple[str, str]) -> tuple[str, str]:
    return natural_key(item[0])


def _name_key(name: str) -> str:
    """A name's :func:`natural_key` as one text, its parts joined by a character below any
    a name holds; a path's, its names' joined by a lower one: text comparison of two paths'
    keys is then :meth:`AgentTree.walk`'s order, name by name. One string per agent, not
    cached: ``in_walk_order`` of every agent (a start reading every log) kept a list and
    a cached key per name, 2 MiB of that start's peak."""
    text, name = _natural_key(name)
    return f"{text}\x01{name}"


_natural_key = natural_key.__wrapped__

MESSAGE_KINDS = frozenset({"request", "reply", "notification", "broadcast", "result", "error"})
_STRINGS = ("message_id", "sender", "recipient", "payload", "timestamp")
_STR: set[type] = {str}
_DICT: set[type] = {dict}
_STR_OR_NONE: set[type] = {str, type(None)}
_DICT_OR_NONE: set[type] = {dict, type(None)}
Deferred = Callable[[], list[dict[str, Any]]]
"""Messages delivered when their inbox is first asked for (:meth:`InboxRegistry.defer`)."""


class AgentState(enum.Enum):
    IDLE = "idle"
    BUSY = "busy"
    WAITING = "waiting"
    TERMINATED = "terminated"


@dataclass(slots=True)
class MessageEnvelope:
    """One message between endpoints (agent ids, or ``"user"``)."""

    message_id: str
    sender: str
    recipient: str
    kind: str
    payload: str
    timestamp: str
    reply_to: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.kind in MESSAGE_KINDS, self.kind

    def to_dict(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "sender": self.sender,
            "recipient": self.recipient,
            "kind": self.kind,
            "payload": self.payload,
            "timestamp": self.timestamp,
            "reply_to": self.reply_to,
            "metadata": dict(self.metadata),
        }

    @staticmethod
    def is_valid(data: object) -> bool:
        """Whether ``data`` (read from a log) is an envelope this version can deliver.

        A checksummed entry can still carry a message kind from a newer
        version; recovery skips and reports such a message instead of failing.
        """
        if not isinstance(data, dict):
            return False
        get = data.get  # a restart asks this of every pending message: no generator
        reply_to = get("reply_to")
        return (
            isinstance(get("message_id"), str)
            and isinstance(get("sender"), str)
            and isinstance(get("recipient"), str)
            and isinstance(get("kind"), str)  # an unhashable one is no kind either
            and get("kind") in MESSAGE_KINDS
            and isinstance(get("payload"), str)
            and isinstance(get("timestamp"), str)
            and (reply_to is None or isinstance(reply_to, str))
            and isinstance(get("metadata") or {}, dict)
        )

    @staticmethod
    def all_valid(messages: list[Any]) -> bool:
        """``all(map(MessageEnvelope.is_valid, messages))``, a field at a time over all of
        them (a restart checks each of the user's thousands of unread messages): only what
        this cannot vouch for at once (not a plain type) is asked of :meth:`is_valid`."""
        try:
            if (
                set(map(type, messages)) <= _DICT
                and all(set(map(type, map(itemgetter(k), messages))) <= _STR for k in _STRINGS)
                and set(map(itemgetter("kind"), messages)) <= MESSAGE_KINDS
                and set(map(type, map(dict.get, messages, repeat("reply_to")))) <= _STR_OR_NONE
                and set(map(type, map(dict.get, messages, repeat("metadata")))) <= _DICT_OR_NONE
            ):
                return True
        except (KeyError, TypeError):  # a field missing, or a kind that is no string
            pass
        return all(map(MessageEnvelope.is_valid, messages))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MessageEnvelope:
        return cls(
            message_id=str(data["message_id"]),
            sender=str(data["sender"]),
            recipient=str(data["recipient"]),
            kind=str(data["kind"]),
            payload=str(data["payload"]),
            timestamp=str(data["timestamp"]),
            reply_to=data.get("reply_to"),
            metadata=dict(data.get("metadata") or {}),
        )


class Inbox:
    """Pending messages of one endpoint, in arrival order.

    A turn *claims* messages when it reads them; they leave the inbox only when
    the turn commits, and go back to pending if it fails.
    """

    def __init__(self) -> None:
        self._messages: dict[str, tuple[int, MessageEnvelope]] = {}
        self._claimed: dict[str, str] = {}
        self._unbuilt: dict[str, tuple[int, dict[str, Any]]] = {}
        """Messages a start delivered as their envelope's data (:meth:`deliver_data`),
        not yet built: a restart fills an inbox of thousands nobody may read soon."""

    def deliver(self, message: MessageEnvelope, order: int) -> bool:
        """Add a message; False if it is already here (re-delivery is a no-op)."""
        if message.message_id in self._messages or message.message_id in self._unbuilt:
            return False
        self._messages[message.message_id] = (order, message)
        return True

    def deliver_data(self, data: dict[str, Any], order: int) -> bool:
        """:meth:`deliver` of ``MessageEnvelope.from_dict(data)`` (``data`` a valid
        envelope's, see :meth:`MessageEnvelope.is_valid`, not changed after), built
        when the inbox is first read."""
        message_id = data["message_id"]
        if message_id in self._messages or message_id in self._unbuilt:
            return False
        self._unbuilt[message_id] = (order, data)
        return True

    def _built(self) -> dict[str, tuple[int, MessageEnvelope]]:
        if self._unbuilt:
            unbuilt, self._unbuilt = self._unbuilt, {}
            for message_id, (order, data) in unbuilt.items():
                self._messages[message_id] = (order, MessageEnvelope.from_dict(data))
        return self._messages

    def pending(self) -> list[MessageEnvelope]:
        """Unclaimed messages, oldest first."""
        items = [v for k, v in self._built().items() if k not in self._claimed]
        return [m for _, m in sorted(items, key=lambda item: item[0])]

    def all(self) -> list[MessageEnvelope]:
        return [m for _, m in sorted(self._built().values(), key=lambda item: item[0])]

    def oldest_pending_order(self) -> int | None:
        orders = [o for k, (o, _) in self._built().items() if k not in self._claimed]
        return min(orders) if orders else None

    def claim(self, turn_id: str) -> list[MessageEnvelope]:
        taken = self.pending()
        for message in taken:
            self._claimed[message.message_id] = turn_id
        return taken

    def release(self, turn_id: str) -> None:
        for message_id in [k for k, t in self._claimed.items() if t == turn_id]:
            del self._claimed[message_id]

    def remove(self, message_ids: list[str]) -> None:
        for message_id in message_ids:
            self._messages.pop(message_id, None)
            self._unbuilt.pop(message_id, None)
            self._claimed.pop(message_id, None)

    def __len__(self) -> int:
        return len(self._messages) + len(self._unbuilt)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._messages or message_id in self._unbuilt


class InboxRegistry:
    """One inbox per endpoint, plus the global arrival order across all of them."""

    def __init__(self) -> None:
        self._inboxes: dict[str, Inbox] = {}
        self._order = itertools.count()
        self._deferred: dict[str, tuple[Deferred, Callable[[list[str]], None]]] = {}

    def inbox(self, endpoint: str) -> Inbox:
        box = self._inboxes.get(endpoint)
        if box is None:
            box = self._inboxes[endpoint] = Inbox()
        if self._deferred and endpoint in self._deferred:
            self._deliver_deferred(endpoint, box)
        return box

    def defer(
        self, endpoint: str, messages: Deferred, delivered: Callable[[list[str]], None]
    ) -> None:
        """Deliver ``messages()`` (valid envelopes' data, in arrival order) to the inbox of
        ``endpoint`` when it is first asked for (:meth:`inbox`: any read of it, any message
        to it), then tell ``delivered`` their ids (substrat.recovery_user). They take the
        next order numbers then, before the message that asked for the inbox."""
        self._deferred[endpoint] = (messages, delivered)

    def _deliver_deferred(self, endpoint: str, box: Inbox) -> None:
        messages, delivered = self._deferred[endpoint]
        pending = messages()  # if it raises, the inbox is asked for again next time
        del self._deferred[endpoint]
        ids = [data["message_id"] for data in pending if box.deliver_data(data, next(self._order))]
        delivered(ids)

    def deliver(self, message: MessageEnvelope) -> bool:
        # the inbox first (a deferred one's messages came first), then the order
        return self.inbox(message.recipient).deliver(message, next(self._order))

    def deliver_data(self, data: dict[str, Any]) -> bool:
        """:meth:`deliver` of the envelope of ``data``, built when first read (see
        :meth:`Inbox.deliver_data`): the order it takes among all inboxes is taken now."""
        return self.inbox(data["recipient"]).deliver_data(data, next(self._order))

    def drop(self, endpoint: str) -> None:
        self._inboxes.pop(endpoint, None)

    def endpoints(self) -> list[str]:
        return [*self._inboxes, *(e for e in self._deferred if e not in self._inboxes)]


@dataclass(slots=True)
class AgentNode:
    """One live agent: a name in the tree and one provider session."""

    agent_id: str
    session_id: str
    name: str
    parent_id: str | None
    instructions: str
    provider: str
    model: str
    state: AgentState = AgentState.IDLE
    children: dict[str, str] = field(default_factory=dict)
    waiting_on: dict[str, str] = field(default_factory=dict)
    """Requests this agent sent and awaits a reply to: message id -> recipient id."""
    lost_turn: dict[str, Any] | None = None
    """The turn a crash cut short, told to the agent at its next turn."""


class AgentTree:
    """Live agents by id, with names unique among siblings (roots are siblings)."""

    def __init__(self) -> None:
        self._nodes: LazyDict[str, AgentNode] = LazyDict(build=self._build)
        self._roots: dict[str, str] = {}
        self._by_session: dict[str, str] = {}
        self._kids: dict[str, dict[str, str]] = {}
        """Agent id of a node not built yet -> its children (name -> id): the node's
        ``children`` once it is built."""

    def add_unbuilt(
        self,
        agent_id: str,
        session_id: str,
        name: str,
        parent_id: str | None,
        instructions: str,
        record: list[Any],
    ) -> None:
        """An agent whose node is built when first asked for (see substrat.lazy), from a
        start summary's record fields (provider and model first): as :meth:`add`
        checks and indexes it (NameCollisionError as there, nothing added)."""
        # validate_name's and LazyDict's checks, inline: asked of most agents of a start
        # from the summary (the usual answer first; validate_name says what is wrong)
        if (
            type(name) is not str
            or len(name) > MAX_NAME_CHARS
            or name in _RESERVED
            or not _NAME.fullmatch(name)
        ):
            validate_name(name)
        nodes = self._nodes
        sources = nodes.sources()
        if agent_id in sources or dict.__contains__(nodes, agent_id):
            raise ValueError(f"agent {agent_id} is already in the tree")
        # _siblings_of, inline
        if parent_id is None:
            siblings = self._roots
        else:
            siblings = self._kids.get(parent_id)  # type: ignore[assignment]
            if siblings is None:
                if parent_id in sources:
                    siblings = self._kids[parent_id] = {}
                else:
                    siblings = self.get(parent_id).children
        if name in siblings:
            raise NameCollisionError(
                f"an agent named {name!r} already exists here; pick another name"
            )
        siblings[name] = agent_id
        sources[agent_id] = (session_id, name, parent_id, instructions, record)
        self._by_session[session_id] = agent_id

    def _build(self, agent_id: str, source: tuple[Any, ...]) -> AgentNode:
        session_id, name, parent_id, instructions, record = source
        # positional, as recovery builds every other node (AgentNode's fields, in order)
        node = AgentNode(agent_id, session_id, name, parent_id, instructions, record[0], record[1])
        kids = self._kids.pop(agent_id, None)
        if kids is not None:
            node.children = kids
        return node

    def unbuilt(self) -> int:
        """How many nodes are not built yet (see :meth:`add_unbuilt`)."""
        return self._nodes.unbuilt()

    def built_ids(self) -> list[str]:
        """The agents whose node is built (none is built by asking)."""
        return self._nodes.built_keys()

    def agent_of(self, session_id: str) -> str | None:
        """The agent id of a live session, its node not built by asking."""
        return self._by_session.get(session_id)

    def session_of(self, agent_id: str) -> str:
        """A live agent's session id, its node not built by asking."""
        source = self._nodes.source(agent_id)
        return source[0] if source is not None else self.get(agent_id).session_id

    def add(self, node: AgentNode) -> None:
        validate_name(node.name)
        if node.agent_id in self._nodes:
            raise ValueError(f"agent {node.agent_id} is already in the tree")
        siblings = self._siblings_of(node.parent_id)
        if node.name in siblings:
            raise NameCollisionError(
                f"an agent named {node.name!r} already exists here; pick another name"
            )
        siblings[node.name] = node.agent_id
        self._nodes[node.agent_id] = node
        self._by_session[node.session_id] = node.agent_id

    def remove(self, agent_id: str) -> AgentNode:
        node = self.get(agent_id)
        assert not node.children, f"agent {agent_id} removed while it has children"
        del self._siblings_of(node.parent_id)[node.name]
        del self._nodes[agent_id]
        del self._by_session[node.session_id]
        return node

    def _siblings_of(self, parent_id: str | None) -> dict[str, str]:
        if parent_id is None:
            return self._roots
        if self._nodes.is_source(parent_id):  # not built: a child is added below it
            kids = self._kids.get(parent_id)
            if kids is None:
                kids = self._kids[parent_id] = {}
            return kids
        return self.get(parent_id).children

    def name_taken(self, parent_id: str | None, name: str) -> bool:
        return name in self._siblings_of(parent_id)

    def get(self, agent_id: str) -> AgentNode:
        try:
            return self._nodes[agent_id]
        except KeyError:
            raise AgentNotFoundError(f"no live agent {agent_id!r}") from None

    def by_session(self, session_id: str) -> AgentNode | None:
        agent_id = self._by_session.get(session_id)
        return None if agent_id is None else self._nodes[agent_id]

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def resolve(self, ref: str) -> AgentNode:
        """An agent by id, by path (``alpha/worker``) or by a unique id prefix.

        An id prefix (at least ``MIN_ID_PREFIX_CHARS`` characters, as ``git``
        takes them) that several ids start with raises AmbiguousAgentError
        listing them; an unknown reference suggests close names.
        """
        found = self.find(ref)
        if found is not None:
            return found
        raise AgentNotFoundError(
            f"no live agent {ref}{too_short_note(ref)}{did_you_mean(ref, self.paths())}"
        )

    def find(self, ref: str) -> AgentNode | None:
        """Like :meth:`resolve`, but None when nothing matches (ambiguity still raises)."""
        if not isinstance(ref, str):  # None or a number would fail deep inside, unexplained
            raise TypeError(
                "an agent is named by a string (its path, its id or a unique id prefix), "
                f"not {type(ref).__name__} {ref!r:.40}"
            )
        if ref in self._nodes:
            return self._nodes[ref]
        agent_id = self._by_path(ref)
        matches = id_prefix_matches(ref, self._nodes.all_keys())
        if agent_id is not None:
            others = [m for m in matches if m != agent_id]
            if others:  # a root named like the start of another agent's id: ask, never guess
                raise ambiguous(
                    ref,
                    {m: self.path(m) for m in (agent_id, *others)},
                    f"{ref} is both the name of agent {self.path(agent_id)} and the start of "
                    f"another agent's id",
                )
            return self._nodes[agent_id]
        if len(matches) > 1:
            raise ambiguous(ref, {m: self.path(m) for m in matches})
        return self._nodes[matches[0]] if matches else None

    def _by_path(self, ref: str) -> str | None:
        parts = [p for p in ref.split("/") if p]
        if not parts:
            return None
        agent_id = self._roots.get(parts[0])
        for part in parts[1:]:
            if agent_id is None:
                break
            agent_id = self._nodes[agent_id].children.get(part)
        return agent_id

    def paths(self) -> list[str]:
        return [self.path(node.agent_id) for node in self.walk()]

    def path(self, agent_id: str) -> str:
        names: list[str] = []
        node: AgentNode | None = self.get(agent_id)
        while node is not None:
            names.append(node.name)
            node = None if node.parent_id is None else self._nodes[node.parent_id]
        return "/".join(reversed(names))

    def root_count(self) -> int:
        """How many live agents have no parent (no node built)."""
        return len(self._roots)

    def roots(self) -> list[AgentNode]:
        return [self._nodes[i] for _, i in sorted(self._roots.items(), key=_by_name)]

    def children(self, agent_id: str) -> list[AgentNode]:
        children = self.get(agent_id).children
        return [self._nodes[i] for _, i in sorted(children.items(), key=_by_name)]

    def siblings(self, agent_id: str) -> list[AgentNode]:
        node = self.get(agent_id)
        group = self._siblings_of(node.parent_id)
        return [self._nodes[i] for n, i in sorted(group.items(), key=_by_name) if i != agent_id]

    def walk(self) -> Iterator[AgentNode]:
        """Every live agent, parents before children, siblings by name (digits as
        numbers: :func:`substrat.words.natural_key`, the order ``list`` and ``tree`` show)."""
        nodes = self._nodes
        stack = [nodes[i] for _, i in sorted(self._roots.items(), key=_by_name, reverse=True)]
        while stack:
            node = stack.pop()
            yield node
            if node.children:  # most agents are leaves: nothing to sort
                later = sorted(node.children.items(), key=_by_name, reverse=True)
                stack.extend([nodes[i] for _, i in later])

    def in_walk_order(self, session_ids: set[str]) -> list[AgentNode]:
        """The live agents of these sessions in :meth:`walk`'s order (the others left out).

        That order is the order of their paths' names compared name by name (a parent's
        names are a prefix of its children's), so a few agents of a large tree are put
        in it without walking the whole tree."""
        nodes = self._nodes
        chosen = [nodes[self._by_session[s]] for s in session_ids if s in self._by_session]
        keys: dict[str, str] = {}  # agent id -> its path's key (a parent's, once)

        def key(node: AgentNode) -> str:
            up = [node]  # the node and its ancestors whose key is not known yet, no
            while (parent := up[-1].parent_id) is not None and parent not in keys:
                up.append(nodes[parent])  # recursion: a tree may be deeper than its limit
            prefix = f"{keys[parent]}\x00" if parent is not None else ""
            for each in reversed(up):
                keys[each.agent_id] = got = prefix + _name_key(each.name)
                prefix = f"{got}\x00"
            return keys[node.agent_id]

        return sorted(chosen, key=key)

    def nodes(self) -> list[AgentNode]:
        """Every live agent, in no promised order (no sorting: a start goes over every
        agent this way where the order does not matter)."""
        return list(self._nodes.values())

    def subtree_leaves_first(self, agent_id: str) -> list[AgentNode]:
        order: list[AgentNode] = []

        def visit(node: AgentNode) -> None:
            for child in self.children(node.agent_id):
                visit(child)
            order.append(node)

        visit(self.get(agent_id))
        return order

    def check(self) -> None:
        """Assert the tree's invariants (no dangling parents, indexes in sync), building
        no node (one not built is as :meth:`add_unbuilt` indexed it)."""
        nodes = self._nodes
        sources = nodes.sources()
        for node in nodes.built_values():
            agent_id = node.agent_id
            assert self._siblings_of(node.parent_id).get(node.name) == agent_id
            for name, child_id in node.children.items():
                source = sources.get(child_id)  # inline: most children are rows at a start
                if source is None:
                    child = nodes[child_id]
                    assert child.parent_id == agent_id and child.name == name
                else:
                    assert source[2] == agent_id and source[1] == name
        for name, root_id in self._roots.items():
            assert self._parent_and_name(root_id) == (None, name)
        for parent_id, kids in self._kids.items():
            assert nodes.is_source(parent_id)
            for name, child_id in kids.items():
                assert self._parent_and_name(child_id) == (parent_id, name)
        assert len(self._by_session) == len(nodes)

    def _parent_and_name(self, agent_id: str) -> tuple[str | None, str]:
        source = self._nodes.source(agent_id)
        if source is not None:
            return source[2], source[1]
        node = self._nodes[agent_id]
        return node.parent_id, node.name
