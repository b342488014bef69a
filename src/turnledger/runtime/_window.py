"""Which context window a new session gets, and where it came from.

A window the user gave always wins. Otherwise the provider is asked (once per
model for the hub's life, under a short timeout) if it can describe models;
if it cannot, or fails, or says something implausible, the fallback applies
and a warning says so. Asking never fails a turn.
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import trio

from ..events import WindowSource
from ..sessions._messages import Start
from ..sessions._ports import DescribesModels, ModelInfo, Provider
from ..sessions._windows import default_output_reserve, fallback_window, plausible_window

__all__ = ["DESCRIBE_TIMEOUT", "WindowCache"]

#: Seconds the hub waits for a provider to describe a model.
DESCRIBE_TIMEOUT: Final = 3.0


class WindowCache:
    """What the provider said about each model, asked once per model."""

    def __init__(self, timeout: float = DESCRIBE_TIMEOUT) -> None:
        self._timeout = timeout
        self._info: dict[str, ModelInfo] = {}
        #: The models being asked about now, each with the event set when
        #: the asking ends (answered, or the asker cancelled).
        self._asking: dict[str, trio.Event] = {}

    async def info(self, provider: Provider, model: str, given: int | None, log: Any) -> ModelInfo:
        """The provider's answer for ``model`` (a fallback if it has none).

        One caller asks; the others wait for its answer and are all woken at
        once. (A lock held for the asking, as before, woke its waiters one
        at a time, a scheduler pass each: a thousand sessions started
        together waited a thousand passes, seconds under load.)

        Cancellation: a waiter just stops waiting; an asker cancelled leaves
        the asking to one of the waiters.
        """
        while True:
            known = self._info.get(model)
            if known is not None:
                await trio.lowlevel.checkpoint()
                return known
            asking = self._asking.get(model)
            if asking is None:
                break
            await asking.wait()
        asking = self._asking[model] = trio.Event()
        try:
            known = self._info[model] = await self._ask(provider, model, given, log)
        finally:
            del self._asking[model]
            asking.set()
        return known

    async def _ask(self, provider: Provider, model: str, given: int | None, log: Any) -> ModelInfo:
        info = await self._described(provider, model, given)
        # A provider that cannot describe models was never expected to: the
        # context_window line says which fallback applies. One that can and
        # did not is worth a warning.
        asked = isinstance(provider, DescribesModels)
        if asked and given is None and info.source != "discovered":
            log.warning("context_window_fallback", model=model, detail=info.detail)
        return info

    async def _described(self, provider: Provider, model: str, given: int | None) -> ModelInfo:
        if not isinstance(provider, DescribesModels):
            return ModelInfo(detail="the provider cannot describe models")
        why = "the server did not answer in time"
        with trio.move_on_after(self._timeout):
            try:
                info = await provider.describe(model, context_window=given)
            except Exception as exc:  # a provider bug must not fail a session
                why = f"describing the model failed ({type(exc).__name__})"
            else:
                if not isinstance(info, ModelInfo):
                    why = "the provider's description is not a ModelInfo"
                elif info.source == "discovered" and not plausible_window(info.context_window):
                    why = "the server reported an implausible window"
                else:
                    return info
        return ModelInfo(detail=why)

    async def start(self, provider: Provider, start: Start, config: Any, log: Any) -> Start:
        """``start`` with the window, reserve and source of a new session."""
        given: int | None = config.context_window
        source: WindowSource
        info = await self.info(provider, start.model, given, log)
        if given is not None:
            window, source, detail = given, "user", "given"
        elif info.source == "discovered" and info.context_window is not None:
            window, source, detail = info.context_window, "discovered", "reported by the server"
        elif info.context_window is not None and plausible_window(info.context_window):
            window, source, detail = info.context_window, "fallback", info.detail
        else:
            window, note = fallback_window(start.model)
            source, detail = "fallback", f"{note} ({info.detail})" if info.detail else note
        reserve = config.output_reserve
        if reserve is None or reserve >= window:
            reserve = default_output_reserve(window, info.max_output_tokens)
        log.info(
            "context_window",
            model=start.model,
            context_window=window,
            output_reserve=reserve,
            window_source=source,
            detail=detail,
        )
        return attrs.evolve(
            start, context_window=window, output_reserve=reserve, window_source=source
        )
