"""Which event loop is running: a clear error for the wrong API, cheaply.

The runtime is trio's (:func:`turnledger.sessions.open_hub`); asyncio code
uses :mod:`turnledger.aio`. Calling one from the other would otherwise fail
deep inside with trio's "must be called from async context", or an asyncio
future awaited by trio; these checks name the API to use instead.
"""

from __future__ import annotations

import sniffio

from ._errors import WrongEventLoop

__all__ = ["require_asyncio", "require_trio"]


def _library() -> str | None:
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return None


def require_trio(api: str) -> None:
    """Raise :class:`WrongEventLoop` unless called from a trio task."""
    if _library() != "trio":
        raise WrongEventLoop(
            f"turnledger.sessions.{api} runs under trio; from asyncio use "
            f"turnledger.aio.{api} (the same hub, with trio as a guest on the asyncio loop)"
        )


def require_asyncio(api: str) -> None:
    """Raise :class:`WrongEventLoop` unless called from an asyncio task."""
    if _library() != "asyncio":
        raise WrongEventLoop(
            f"turnledger.aio.{api} is for asyncio code; under trio use "
            f"turnledger.sessions.{api} (trio's own hub), which this one wraps"
        )
