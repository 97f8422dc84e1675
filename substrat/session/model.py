"""The session record: what one provider session is, and its lifecycle."""

from __future__ import annotations

import base64
import binascii
import enum
import json
import re
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from substrat.errors import CorruptRecordError, InvalidSessionIdError, InvalidTransitionError
from substrat.jsontext import check_plain_json

RECORD_VERSION = 1
_SESSION_ID = re.compile(r"[0-9a-f]{32}")


class SessionState(enum.Enum):
    """CREATED -> ACTIVE <-> SUSPENDED -> TERMINATED (any live state may terminate).

    ACTIVE (a live provider session) is a state in memory: a record on disk says
    CREATED, SUSPENDED or TERMINATED (see ``SessionStore.activate``)."""

    CREATED = "created"
    ACTIVE = "active"
    SUSPENDED = "suspended"
    TERMINATED = "terminated"


_ALLOWED: dict[SessionState, frozenset[SessionState]] = {
    SessionState.CREATED: frozenset({SessionState.ACTIVE, SessionState.TERMINATED}),
    SessionState.ACTIVE: frozenset({SessionState.SUSPENDED, SessionState.TERMINATED}),
    SessionState.SUSPENDED: frozenset({SessionState.ACTIVE, SessionState.TERMINATED}),
    SessionState.TERMINATED: frozenset(),
}


def new_session_id() -> str:
    return uuid.uuid4().hex


def is_session_id(value: str) -> bool:
    """Whether ``value`` is a session id (see :func:`validate_session_id`)."""
    return _SESSION_ID.fullmatch(value) is not None


def validate_session_id(value: object) -> str:
    """Return ``value`` if it is a 32-character lowercase hex UUID, else raise."""
    if not isinstance(value, str) or not _SESSION_ID.fullmatch(value):
        raise InvalidSessionIdError(
            f"{value!r} is not a session id (32 lowercase hex characters, a UUID's hex form)"
        )
    return value


@dataclass(slots=True)
class Session:
    """One provider session, as recorded in ``agents/<id>/session.json``.

    ``provider_state`` is the provider's opaque blob from its last suspend;
    ``state_seq`` is the event-log ``seq`` the blob is current up to, so a blob
    older than the log is recognised and the history is rebuilt from the log.
    """

    session_id: str
    provider: str
    model: str
    state: SessionState = SessionState.CREATED
    provider_state: bytes = b""
    state_seq: int = 0
    agent_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_session_id(self.session_id)

    def transition(self, target: SessionState) -> None:
        """Move to ``target``; raise InvalidTransitionError if the lifecycle forbids it."""
        if target not in _ALLOWED[self.state]:
            raise InvalidTransitionError(
                f"session {self.session_id}: {self.state.value} -> {target.value} is not "
                "allowed (CREATED -> ACTIVE <-> SUSPENDED -> TERMINATED)"
            )
        self.state = target

    def to_record(self) -> bytes:
        """The record's bytes; TypeError (before anything is written) when ``extra`` is not
        plain JSON, e.g. an integer wider than 64 bits, which would not read back as written."""
        check_plain_json(self.extra, "extra")
        body: dict[str, Any] = {
            "version": RECORD_VERSION,
            "session_id": self.session_id,
            "agent_id": self.agent_id,
            "provider": self.provider,
            "model": self.model,
            "state": self.state.value,
            "state_seq": self.state_seq,
            "provider_state": base64.b64encode(self.provider_state).decode("ascii"),
            "extra": self.extra,
        }
        body["crc"] = f"{zlib.crc32(_canonical(body)):08x}"
        fast = _indented(body)
        if fast is None:
            return (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()
        return fast

    @classmethod
    def from_record(cls, raw: bytes, expected_id: str | None = None) -> Session:
        """Parse a record; raise CorruptRecordError with the reason on any damage."""
        try:
            body = orjson.loads(raw)  # a restart reads every record: the fast parser first
        except orjson.JSONDecodeError:
            try:  # what orjson refuses and json takes (NaN, integers over 64 bits)
                body = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                raise CorruptRecordError(f"not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise CorruptRecordError("record is not a JSON object")
        version = body.get("version")
        if version != RECORD_VERSION:
            raise CorruptRecordError(
                f"unknown record version {version!r} (this substrat reads {RECORD_VERSION})"
            )
        crc = body.pop("crc", None)
        if not _crc_matches(body, crc):
            raise CorruptRecordError("checksum mismatch")
        try:
            session = cls(
                session_id=body["session_id"],  # validated by __post_init__
                provider=_str(body, "provider"),
                model=_str(body, "model"),
                state=SessionState(body["state"]),
                provider_state=_blob(body["provider_state"]),
                state_seq=int(body["state_seq"]),
                agent_id=_str(body, "agent_id"),
                extra=dict(body.get("extra") or {}),
            )
        except (KeyError, ValueError, TypeError, binascii.Error, InvalidSessionIdError) as exc:
            raise CorruptRecordError(f"invalid field: {exc}") from None
        if expected_id is not None and session.session_id != expected_id:
            raise CorruptRecordError(
                f"record names session {session.session_id} but lives in {expected_id}/"
            )
        return session


def _indented(body: dict[str, Any]) -> bytes | None:
    """``json.dumps(body, sort_keys=True, indent=1) + "\\n"``, byte for byte, for a record
    (:meth:`Session.to_record`'s body) whose values are plain strings, integers and an
    empty ``extra`` (most records); None for any other. json's indented form is its
    pure-Python encoder (half of a record's save); this is its C string encoder, once per
    value, into the record's one layout (its keys are fixed, so sorted once, here)."""
    extra, seq, version = body["extra"], body["state_seq"], body["version"]
    if len(body) != len(_RECORD_KEYS) or type(extra) is not dict or extra:
        return None
    if type(seq) is not int or type(version) is not int:  # a bool is no int here
        return None
    encode = _encode_string
    try:  # it refuses anything but a string (a subclass is encoded as json would)
        text = (
            f'{{\n "agent_id": {encode(body["agent_id"])},\n "crc": {encode(body["crc"])},'
            f'\n "extra": {{}},\n "model": {encode(body["model"])},\n "provider": '
            f'{encode(body["provider"])},\n "provider_state": {encode(body["provider_state"])},'
            f'\n "session_id": {encode(body["session_id"])},\n "state": {encode(body["state"])},'
            f'\n "state_seq": {int.__repr__(seq)},\n "version": {int.__repr__(version)}\n}}\n'
        )
    except (TypeError, KeyError):
        return None
    return text.encode()


_RECORD_KEYS = (
    *("agent_id", "crc", "extra", "model", "provider", "provider_state", "session_id"),
    *("state", "state_seq", "version"),
)
"""A record's keys, in the order json's ``sort_keys`` puts them (:func:`_indented`)."""


def _canonical(body: dict[str, Any]) -> bytes:
    """``json.dumps(body, sort_keys=True, separators=(",", ":")).encode()``, the form a
    record's checksum is taken of, byte for byte.

    A record with an empty ``extra`` (most: its other values are strings and
    integers) is formatted by orjson, whose sorted compact form is the same bytes
    when they are printable ASCII (json escapes the rest, DEL too, and orjson does
    not); any other record, or other bytes, by json (which took two thirds of a
    record's save: 28 -> 8 us here).
    """
    if not body["extra"]:
        try:
            fast = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # e.g. a lone surrogate: json says how it reads
            fast = b"\x7f"
        if fast.isascii() and b"\x7f" not in fast:
            return fast
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


_encode_string = json.encoder.encode_basestring_ascii  # json.dumps's own, for ensure_ascii


def _crc_matches(body: dict[str, Any], crc: object) -> bool:
    """Whether ``crc`` is the checksum of ``body``'s canonical JSON (see to_record).

    orjson's sorted compact form is the canonical form byte for byte when the
    record is ASCII (every record substrat writes, unless ``extra`` is not); it
    is tried first, then the canonical form itself.
    """
    if not isinstance(crc, str):
        return False
    try:
        fast = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        fast = b""
    if crc == f"{zlib.crc32(fast):08x}":
        return True
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return crc == f"{zlib.crc32(canonical.encode()):08x}"


def _blob(encoded: Any) -> bytes:
    """A record's base64 ``provider_state`` (most are empty: no decoding then)."""
    if encoded == "":
        return b""
    return base64.b64decode(encoded, validate=True)


def _str(body: dict[str, Any], key: str) -> str:
    value = body[key]
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a string")
    return value
