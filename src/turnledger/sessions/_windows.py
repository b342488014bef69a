"""Context windows when the server cannot tell: the fallback table, the
output reserve, and what counts as a plausible window. Pure."""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "FALLBACK_WINDOWS",
    "MAX_PLAUSIBLE_WINDOW",
    "MIN_PLAUSIBLE_WINDOW",
    "default_output_reserve",
    "fallback_window",
    "plausible_window",
]

#: The window of a model nobody can tell us about: small enough for most
#: local models' defaults, as the Ollama write-up uses.
DEFAULT_CONTEXT_WINDOW: Final = 8192

#: Windows smaller or larger than these are a server's mistake, not a model.
MIN_PLAUSIBLE_WINDOW: Final = 256
MAX_PLAUSIBLE_WINDOW: Final = 10_000_000

#: Well-known model families by name prefix (lower case; the longest
#: matching prefix wins) and their context windows in tokens, as published
#: by their makers. Served models may be configured smaller: a server that
#: reports its window is always asked first.
FALLBACK_WINDOWS: Final[dict[str, int]] = {
    "gpt-5": 400_000,
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4-turbo": 128_000,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "o1": 200_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "claude": 200_000,
    "llama3.1": 131_072,
    "llama3.2": 131_072,
    "llama3": 8_192,
    "llama2": 4_096,
    "mistral": 32_768,
    "qwen2.5": 32_768,
    "gemma2": 8_192,
    "phi3": 4_096,
}


def fallback_window(model: str) -> tuple[int, str]:
    """The window for ``model`` from :data:`FALLBACK_WINDOWS`, or the default;
    with a short note saying which."""
    name = model.lower().rpartition("/")[2]
    best = ""
    for prefix in FALLBACK_WINDOWS:
        if name.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    if best:
        return FALLBACK_WINDOWS[best], f"the known window of the {best} family"
    return DEFAULT_CONTEXT_WINDOW, f"the default of {DEFAULT_CONTEXT_WINDOW} tokens"


def plausible_window(value: object) -> bool:
    """Whether a window a server reported can be believed."""
    return type(value) is int and MIN_PLAUSIBLE_WINDOW <= value <= MAX_PLAUSIBLE_WINDOW


def default_output_reserve(window: int, max_output_tokens: int | None) -> int:
    """Tokens of ``window`` kept for the answer: the request's ``max_tokens``
    when set (at most half the window), else a quarter of the window, at
    most 4,096."""
    if max_output_tokens is not None and max_output_tokens > 0:
        return min(max_output_tokens, window // 2)
    return min(window // 4, 4096)
