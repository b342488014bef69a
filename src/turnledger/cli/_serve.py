"""``turnledger serve``: the HTTP service and the browser timeline
(:mod:`turnledger.serve`; needs the ``serve`` extra)."""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

from ._args import add_provider_arguments, provider_settings
from ._chat import _endpoint
from ._errors import EXIT_USAGE, Exit

if TYPE_CHECKING:
    from ..serve import ServeOptions

__all__ = ["add_serve_parser", "serve_options"]


def _model_server(args: argparse.Namespace) -> Callable[[], AbstractAsyncContextManager[str]]:
    @asynccontextmanager
    async def opened() -> AsyncIterator[str]:
        # The same endpoint as chat: the built-in loopback server without --base-url.
        async with _endpoint(args) as endpoint:
            yield endpoint.base_url

    return opened


def _token(args: argparse.Namespace) -> str | None:
    # (run_serve checks that a header can carry it)
    if not args.token_env:
        return None
    token = os.environ.get(args.token_env)
    if not token:
        raise Exit(EXIT_USAGE, f"--token-env: {args.token_env} is not set")
    return token


def _retention(args: argparse.Namespace) -> Any:
    from ..serve import ServeOptionsError
    from ..sessions import RetentionPolicy

    older, turns = args.prune_older_than, args.prune_max_turns
    if older is None and turns is None:
        return None
    if turns is not None and turns < 1:
        raise ServeOptionsError("--prune-max-turns must be 1 or more")
    return RetentionPolicy(older, turns)


def serve_options(args: argparse.Namespace) -> ServeOptions:
    """The :class:`~turnledger.serve.ServeOptions` the command line's options
    describe (all the command line does before :func:`run_serve`)."""
    from ..serve import ServeOptions, ServeSettings
    from ._stores import command_keys

    return ServeOptions(
        db=args.db,
        provider=provider_settings(args),
        model=args.model,
        host=args.host,
        port=args.port,
        system=args.system,
        on_busy=args.on_busy,
        history_window=args.window,
        max_request_bytes=args.max_request_bytes,
        max_prompt_tokens=args.max_prompt_tokens,
        context_window=args.context_window,
        output_reserve=args.output_reserve,
        turn_deadline=args.timeout,
        idle_timeout=args.idle_timeout,
        grace=args.grace,
        max_connections=args.max_connections,
        header_timeout=args.header_timeout,
        retention=_retention(args),
        prune_every=args.prune_every,
        keys=command_keys(),
        snapshot_every=args.snapshot_every,
        node_id=args.node_id,
        advertise=args.advertise,
        lease=args.lease,
        preview_retention=args.preview_retention,
        app=ServeSettings(
            token=_token(args),
            allowed_origins=frozenset(args.allow_origin),  # (run_serve checks them)
            max_body_bytes=args.max_body_bytes,
            max_starting=args.max_starting,
            start_hold=args.start_hold,
            keep_results_bytes=args.keep_results_bytes,
        ),
    )


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
        return await run_serve(serve_options(args), endpoint=_model_server(args))
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
    add_provider_arguments(s)
    s.set_defaults(run=_cmd_serve)
