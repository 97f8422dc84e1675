"""Providers: the LLM backends behind agent sessions, and their registry."""

from substrat.providers.base import (
    AgentContext,
    Provider,
    ProviderSession,
    ToolSpec,
    TurnRecord,
)
from substrat.providers.registry import (
    ENTRY_POINT_GROUP,
    ProviderRegistry,
    default_registry,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "AgentContext",
    "Provider",
    "ProviderRegistry",
    "ProviderSession",
    "ToolSpec",
    "TurnRecord",
    "default_registry",
]
