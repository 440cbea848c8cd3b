"""Bounds of the agent routes, importable without an agent framework."""

# The most turns one conversation read returns (API and console).
CONVERSATION_MAX_TURNS = 200
