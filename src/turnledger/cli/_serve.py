"""``turnledger serve``: the HTTP service and the browser timeline
(:mod:`turnledger.serve`; needs the ``serve`` extra)."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ._chat import _endpoint
from ._errors import EXIT_USAGE, Exit

__all__ = ["add_serve_parser"]


@asynccontextmanager
async def _model_server(args: argparse.Namespace) -> AsyncIterator[str]:
    # The same endpoint as chat: the built-in loopback server without --base-url.
    async with _endpoint(args) as endpoint:
        yield endpoint.base_url


async def _cmd_serve(args: argparse.Namespace) -> int:
    from ..serve import ServeOptionsError, run_serve

    try:  # the server stack is an extra; every other command works without it
        import hypercorn.trio  # noqa: F401
        import starlette.applications  # noqa: F401
    except ImportError as exc:
        raise Exit(
            EXIT_USAGE, f"serve needs the serve extra: pip install 'turnledger[serve]' ({exc})"
        ) from None
    try:
        return await run_serve(args, endpoint=_model_server)
    except ServeOptionsError as exc:
        raise Exit(EXIT_USAGE, str(exc)) from None


def add_serve_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``serve`` command."""
    from ..serve import add_serve_arguments

    s = sub.add_parser(
        "serve",
        help="HTTP API and browser timeline over a store",
        parents=[common],
        description="Run sessions behind an HTTP API (turns streamed as SSE, reattach with "
        "Last-Event-ID, cancel, sessions, events, state) and serve the timeline page at /. "
        "SIGTERM lets turns in flight end within --grace, then writes the rest as interrupted.",
        epilog="examples:\n  turnledger serve --db chat.db                  then open "
        "http://127.0.0.1:8421/\n"
        "  turnledger serve --db chat.db --base-url http://127.0.0.1:8080/v1 --model llama3\n"
        "  turnledger serve --db chat.db --allow-origin http://localhost:3000   a local web app\n"
        "  TL_TOKEN=... turnledger serve --db chat.db --host 0.0.0.0 --token-env TL_TOKEN",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_serve_arguments(s)
    s.set_defaults(run=_cmd_serve)
