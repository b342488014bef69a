"""Argument types of the parser: each refuses a bad value as a usage error
(exit 2) before anything is opened; and the one group of provider and budget
options that ``chat``, ``serve`` and ``demo`` share."""

from __future__ import annotations

import argparse
import json
import os
import urllib.parse
from collections.abc import Callable
from typing import Any

from .. import ProviderSettingsError
from ..adapters.providers import PROVIDER_KINDS, ProviderSettings
from ._display import visible
from ._errors import EXIT_USAGE, Exit

__all__ = [
    "PROVIDER_OPTIONS",
    "add_provider_arguments",
    "at_least",
    "http_url",
    "key_json",
    "open_configured_provider",
    "positive",
    "provider_settings",
    "text_arg",
]


def text_arg(text: str) -> str:
    """An argument that names something (a session id, a system prompt):
    not empty, and Unicode that can be stored (no lone surrogate, which is
    what a non-UTF-8 byte in the command line becomes)."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(
            f"not valid Unicode: {text.encode('utf-8', 'backslashreplace').decode()!r}"
        ) from None
    return text


def at_least(low: int) -> Callable[[str], int]:
    """An integer argument of at least ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
        return value

    return parse


def http_url(text: str) -> str:
    """An ``http://`` or ``https://`` URL with a host."""
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises for a port that is not a number
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a URL: {exc}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"not an http:// or https:// URL: {visible(text)!r}")
    return text


def positive(kind: type[int] | type[float]) -> Callable[[str], Any]:
    """A finite number above zero, of ``kind``."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
        return value

    return parse


def key_json(text: str) -> tuple[str, Any]:
    """``KEY=JSON``: a request field and its value."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=JSON, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{key}: not JSON: {exc}") from exc


#: The title of the shared group in ``--help``.
PROVIDER_OPTIONS = "model provider and budgets"


def add_provider_arguments(p: argparse.ArgumentParser, *, scripted: bool = False) -> None:
    """The provider and budget options, one group for every command that
    runs turns: ``chat`` and ``serve`` take all of them (a test checks that
    they agree), and read them with :func:`provider_settings`. ``demo``
    (``scripted``) takes the protocol only: its scenes bring their own
    loopback server and budgets."""
    g = p.add_argument_group(PROVIDER_OPTIONS)
    kinds = PROVIDER_KINDS.values()
    if scripted:
        g.add_argument("--provider", choices=list(PROVIDER_KINDS), default="openai",
                       help="the wire protocol the scenes speak (default: %(default)s); "
                       "the last scene runs one turn through each")  # fmt: skip
        return
    g.add_argument("--provider", choices=list(PROVIDER_KINDS), default="openai",
                   help="the wire protocol: " + "; ".join(f"{k.name}: {k.summary}" for k in kinds)
                   + " (default: %(default)s)")  # fmt: skip
    g.add_argument("--base-url", type=http_url, help="e.g. " + ", ".join(
                       f"{k.example_url} ({k.name})" for k in kinds)
                   + "; default: the provider's variable (" + ", ".join(
                       dict.fromkeys(k.url_env for k in kinds))
                   + "), else the built-in loopback server")  # fmt: skip
    g.add_argument("--model", type=text_arg, default=None,
                   help="model name, e.g. gpt-4o (required with an endpoint; "
                   "default with the loopback server: loopback)")  # fmt: skip
    g.add_argument("--api-key-env", default=None, metavar="NAME",
                   help="environment variable holding the API key, e.g. MY_KEY (default: "
                   + ", ".join(dict.fromkeys(k.key_env for k in kinds))
                   + ", by provider)")  # fmt: skip
    g.add_argument("--max-request-bytes", type=positive(int), default=None, metavar="N",
                   help="cap on the request body, in bytes, e.g. 200000")  # fmt: skip
    g.add_argument("--max-prompt-tokens", type=positive(int), default=None, metavar="N",
                   help="cap on the estimated prompt tokens (~4 characters a token)")  # fmt: skip
    g.add_argument("--context-window", type=positive(int), default=None, metavar="TOKENS",
                   help="the model's context window (default: ask the server, else a "
                   "known model family, else 8192)")  # fmt: skip
    g.add_argument("--output-reserve", type=at_least(0), default=None, metavar="TOKENS",
                   help="tokens of the window kept for the answer (default: --max-tokens, "
                   "else a quarter of the window, at most 4096)")  # fmt: skip
    g.add_argument("--window", type=positive(int), default=None, metavar="N",
                   help="history policy Window(N): keep at most N turns in the context, "
                   "evicted turns never come back (default: Ledger, keep every turn)")  # fmt: skip
    g.add_argument("--timeout", type=positive(float), default=120.0, metavar="SECONDS",
                   help="overall deadline per turn (default: %(default)s)")  # fmt: skip
    g.add_argument("--max-tokens", type=at_least(1), default=None, metavar="N",
                   help="most tokens in an answer, e.g. 500 (OpenAI and Anthropic "
                   "max_tokens, Responses max_output_tokens, Ollama num_predict); an answer "
                   "cut there is not kept")  # fmt: skip
    g.add_argument("--temperature", type=float, default=None, metavar="T",
                   help="sampling temperature, e.g. 0.2 (default: the server's)")  # fmt: skip
    g.add_argument("--stop", action="append", default=None,
                   help="stop sequence, e.g. --stop END (repeatable)")  # fmt: skip
    g.add_argument("--param", action="append", type=key_json, default=[], metavar="KEY=JSON",
                   help="any other request field, e.g. --param seed=7 (repeatable)")  # fmt: skip


def provider_settings(args: argparse.Namespace) -> ProviderSettings:
    """The provider the options of :func:`add_provider_arguments` describe.

    Raises:
        Exit: (usage) ``--output-reserve`` is not below ``--context-window``.
    """
    window, reserve = args.context_window, args.output_reserve
    if window is not None and reserve is not None and reserve >= window:
        raise Exit(EXIT_USAGE, "--output-reserve must be below --context-window")
    return ProviderSettings(
        kind=args.provider,
        base_url=args.base_url,
        api_key_env=args.api_key_env,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        stop=args.stop,
        extra=dict(args.param),
    )


def open_configured_provider(
    settings: ProviderSettings, base_url: str, *, loopback: bool, **options: Any
) -> Any:
    """The provider of ``settings`` at ``base_url``: the built-in loopback
    server (``loopback``) is never sent a key; elsewhere ``--api-key-env``
    must name a variable that is set. ``options`` go to
    :meth:`ProviderSettings.open` (``client``, ``timeout``).

    Raises:
        Exit: (usage) the key variable is not set, or the request settings
            cannot work (the Responses API has no ``--stop``...).
    """
    if not loopback and settings.api_key_env and os.environ.get(settings.api_key_env) is None:
        raise Exit(EXIT_USAGE, f"--api-key-env: {settings.api_key_env} is not set")
    try:
        return settings.open(base_url=base_url, api_key="" if loopback else None, **options)
    except ProviderSettingsError as exc:
        raise Exit(EXIT_USAGE, f"bad request settings: {exc}") from None
