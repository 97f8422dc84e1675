"""Sessions: the record of one provider session and the store that keeps them."""

from substrat.session.model import (
    Session,
    SessionState,
    new_session_id,
    validate_session_id,
)
from substrat.session.store import Quarantined, ScanResult, SessionStore

__all__ = [
    "Quarantined",
    "ScanResult",
    "Session",
    "SessionState",
    "SessionStore",
    "new_session_id",
    "validate_session_id",
]
