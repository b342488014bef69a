"""What to fix when a turn fails: a hint for the person at the terminal.

Built from the turn's outcome (a reason and a short detail such as
``HTTP 401``, never a provider's error body) and the chat's own settings:
the URL, the model, which variable the key was read from. Hints are printed
on stderr only; no log line or event carries them, and none names the key.
"""

from __future__ import annotations

import urllib.parse

import attrs

from ..sessions import DiscardedResult, TurnResult

__all__ = ["ChatSettings", "hint"]


@attrs.frozen
class ChatSettings:
    """What a hint may name about the chat."""

    #: The URL requests are posted to.
    url: str
    #: Where the endpoint came from: ``--base-url``, the provider's variable
    #: (``OPENAI_BASE_URL``, ``OLLAMA_HOST``, ``ANTHROPIC_BASE_URL``) or ``loopback``.
    source: str
    model: str
    #: The variable the key was read from (``None`` for the loopback server).
    key_var: str | None
    key_set: bool
    connect_timeout: float | None
    read_timeout: float | None
    turn_deadline: float
    #: The ``--provider`` (a key of ``PROVIDER_KINDS``).
    provider: str = "openai"


#: What a base URL looks like, by provider, for a 404.
_URL_SHAPE = {
    "openai": "an OpenAI-style URL usually ends in /v1",
    "openai-responses": "an OpenAI-style URL usually ends in /v1; /responses is added",
    "anthropic": "an Anthropic URL is the host, e.g. https://api.anthropic.com; "
    "/v1/messages is added",
    "ollama": "Ollama's is the host, e.g. http://127.0.0.1:11434",
}


def _host_port(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def _seconds(value: float | None) -> str:
    return "no limit" if value is None else f"{value:g} s"


def _where(s: ChatSettings) -> str:
    if s.source == "loopback":
        return "the built-in loopback server"
    flag = "--base-url" if s.source == "--base-url" else f"{s.source} (or --base-url)"
    return f"the URL from {flag}"


def _status_hint(code: int, s: ChatSettings) -> str:
    if code in (401, 403):
        if s.key_var is None:
            return f"the server refused the request (HTTP {code}) and no key is sent to it"
        if not s.key_set:
            return (
                f"HTTP {code}: no API key was sent: {s.key_var} is not set (or empty). Set it, or "
                "name the variable that holds the key with --api-key-env NAME"
            )
        return (
            f"HTTP {code}: the API key read from {s.key_var} was rejected by "
            f"{_host_port(s.url)}: check that it is valid for this server, or name "
            "another variable with --api-key-env NAME"
        )
    if code == 404:
        return (
            f"HTTP 404: nothing at {s.url} for model {s.model!r}: check --model, and "
            f"{_where(s)} ({_URL_SHAPE.get(s.provider, _URL_SHAPE['openai'])})"
        )
    if code == 429:
        return "HTTP 429: the server is rate limiting: wait a moment and ask again"
    if code == 529:
        return (
            f"HTTP 529: {_host_port(s.url)} is overloaded (Anthropic's status for it): "
            "wait a moment and ask again"
        )
    if 500 <= code < 600:
        return f"HTTP {code}: the server at {_host_port(s.url)} failed; try again later"
    return f"HTTP {code} from {s.url}"


def hint(result: TurnResult, s: ChatSettings) -> str | None:
    """One line saying what to fix after ``result``, or ``None`` when the
    outcome explains itself (a committed turn, a cancel, a refused question)."""
    if not isinstance(result, DiscardedResult):
        return None
    detail = result.detail
    if result.reason == "http_status" and detail.startswith("HTTP "):
        try:
            code = int(detail.removeprefix("HTTP ").split()[0])
        except (ValueError, IndexError):
            return None
        return _status_hint(code, s)
    where = _host_port(s.url)
    if result.reason == "transport" and detail == "connect error":
        return (
            f"could not connect to {where} ({_where(s)}): is the server running, "
            "and is that the right host and port?"
        )
    if result.reason == "timeout":
        if detail == "connect timeout":
            return (
                f"the connect timeout ({_seconds(s.connect_timeout)}) fired: {where} "
                "did not accept a connection"
            )
        if detail == "read timeout":
            return (
                f"the read timeout ({_seconds(s.read_timeout)}) fired: {where} sent "
                "nothing for that long"
            )
        if detail in ("write timeout", "pool timeout"):
            return f"the {detail} fired while sending to {where}"
        if detail == "idle":
            return f"the idle limit fired: {where} stopped sending in mid-answer"
        return (
            f"the turn deadline (--timeout {s.turn_deadline:g} s) fired before a "
            "complete answer arrived; raise --timeout for long answers"
        )
    return None
