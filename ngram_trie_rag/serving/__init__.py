"""Drafting for engines that batch many requests (vLLM): one Drafter per request."""

from .request_drafters import RequestDrafters

__all__ = ["RequestDrafters"]
