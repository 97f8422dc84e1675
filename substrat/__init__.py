"""Substrat: a crash-safe orchestrator for trees of LLM agents."""

__version__ = "0.1.0"
