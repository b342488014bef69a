"""The wire protocols a command line can choose, as one table.

Pure: imports no I/O library (each provider class is imported on use).
``turnledger chat``, ``serve`` and ``demo`` read their ``--provider``
choices, environment variables and loopback paths from here.
"""

from __future__ import annotations

import importlib
from typing import Any, Final

import attrs

__all__ = ["PROVIDER_KINDS", "ProviderKind"]


@attrs.frozen
class ProviderKind:
    """One wire protocol and how a command line reaches it."""

    #: The ``--provider`` value.
    name: str
    #: What it is, for ``--help``.
    summary: str
    #: ``module:Class`` of the provider, under ``turnledger.adapters.providers``.
    factory: str
    #: The variable holding the base URL (as the vendor's own tools read it).
    url_env: str
    #: The variable holding the API key.
    key_env: str
    #: Where the built-in loopback server answers it (added to its base URL).
    loopback_path: str
    #: What a base URL looks like, for hints.
    example_url: str

    def provider_class(self) -> Any:
        """The provider class (imported now)."""
        module, _, name = self.factory.partition(":")
        return getattr(importlib.import_module(f"{__package__}.{module}"), name)


PROVIDER_KINDS: Final[dict[str, ProviderKind]] = {
    k.name: k
    for k in (
        ProviderKind(
            "openai",
            "OpenAI chat completions (SSE)",
            "openai:OpenAIChat",
            "OPENAI_BASE_URL",
            "OPENAI_API_KEY",
            "/v1",
            "http://127.0.0.1:8080/v1",
        ),
        ProviderKind(
            "ollama",
            "Ollama's /api/chat (NDJSON)",
            "ollama:OllamaChat",
            "OLLAMA_HOST",
            "OLLAMA_API_KEY",
            "",
            "http://127.0.0.1:11434",
        ),
        ProviderKind(
            "anthropic",
            "Anthropic Messages (SSE)",
            "anthropic:AnthropicChat",
            "ANTHROPIC_BASE_URL",
            "ANTHROPIC_API_KEY",
            "",
            "https://api.anthropic.com",
        ),
        ProviderKind(
            "openai-responses",
            "OpenAI Responses (SSE)",
            "responses:OpenAIResponses",
            "OPENAI_BASE_URL",
            "OPENAI_API_KEY",
            "/v1",
            "https://api.openai.com/v1",
        ),
    )
}
