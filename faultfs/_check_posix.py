"""Imported first by faultfs's public modules that reach its interception
(:mod:`faultfs.stateful`, :mod:`faultfs.pytest_plugin`): on a system without
POSIX calls (Windows) importing it raises ImportError saying why, instead of a
failure deep inside on ``fcntl`` (see :mod:`faultfs._platform`)."""

from faultfs._platform import unsupported_reason

_REASON = unsupported_reason()
if _REASON is not None:
    raise ImportError(_REASON)
