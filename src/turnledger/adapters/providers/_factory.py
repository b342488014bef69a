"""One provider from a few settings: :func:`open_provider`, the twin of
:func:`~turnledger.adapters.stores.open_store`.

A protocol name (one of :data:`PROVIDER_KINDS`) picks the class; the base
URL, the API key and the request fields are read the way each vendor's own
tools read them, so the same settings mean the same thing in a program, in
``turnledger chat`` and in ``turnledger serve``:

- the base URL: ``base_url``, else the protocol's variable
  (``OPENAI_BASE_URL``, ``OLLAMA_HOST``, ``ANTHROPIC_BASE_URL``), else the
  vendor's public endpoint (Ollama: ``http://127.0.0.1:11434``);
- the key: ``api_key``, else the variable ``api_key_env`` names (which must
  be set), else the protocol's variable (``OPENAI_API_KEY``,
  ``ANTHROPIC_API_KEY``, ``OLLAMA_API_KEY``), else none is sent;
- ``temperature``, ``max_tokens`` and ``stop`` in each protocol's words
  (Ollama's go into its ``options``: ``num_predict`` for ``max_tokens``).

Settings that cannot work raise :class:`~turnledger.ProviderSettingsError`
before a client is created. Importing this module imports no I/O library;
the provider's module (and httpx) load when a provider is built.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs

from ..._errors import ProviderSettingsError
from ...wire import StreamLimits
from ._kinds import PROVIDER_KINDS, ProviderKind
from ._retry import RetryPolicy

if TYPE_CHECKING:
    import httpx

    from .anthropic import AnthropicChat
    from .ollama import OllamaChat
    from .openai import OpenAIChat
    from .responses import OpenAIResponses

    #: What :func:`open_provider` returns: one of the HTTP providers.
    HTTPProvider: TypeAlias = OpenAIChat | OllamaChat | AnthropicChat | OpenAIResponses

__all__ = ["Endpoint", "ProviderSettings", "configured_endpoint", "open_provider"]

#: Where each protocol's provider goes when neither ``base_url`` nor the
#: protocol's variable says.
DEFAULT_URLS: Mapping[str, str] = {
    "openai": "https://api.openai.com/v1",
    "ollama": "http://127.0.0.1:11434",
    "anthropic": "https://api.anthropic.com",
    "openai-responses": "https://api.openai.com/v1",
}


def provider_kind(kind: str) -> ProviderKind:
    """The protocol named ``kind``, or :class:`ProviderSettingsError` naming the known ones."""
    found = PROVIDER_KINDS.get(kind) if isinstance(kind, str) else None
    if found is None:
        known = ", ".join(PROVIDER_KINDS)
        raise ProviderSettingsError(f"unknown provider kind {kind!r} (known: {known})")
    return found


@attrs.frozen
class Endpoint:
    """A base URL the caller configured, and where it came from."""

    #: The base URL, as the provider is given it.
    url: str
    #: ``base_url``, or the variable it was read from (``OPENAI_BASE_URL``...).
    source: str


def _checked_url(url: str, source: str) -> str:
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises for a port that is not a number
    except ValueError as exc:
        raise ProviderSettingsError(f"{source}: not a URL ({exc})") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        # (the value may hold a key in its query: it is not repeated)
        raise ProviderSettingsError(f"{source}: not an http:// or https:// URL")
    return url


def configured_endpoint(
    kind: str, base_url: str | None = None, environ: Mapping[str, str] | None = None
) -> Endpoint | None:
    """The base URL ``base_url`` or the protocol's variable configures, checked;
    None if neither does (the vendor's endpoint, or a caller's own default,
    applies)."""
    wire = provider_kind(kind)
    if base_url:
        return Endpoint(_checked_url(base_url, "base_url"), "base_url")
    env = os.environ if environ is None else environ
    value = env.get(wire.url_env)
    if not value:
        return None
    if wire.url_env == "OLLAMA_HOST" and "://" not in value:
        value = "http://" + value  # OLLAMA_HOST is often host:port
    return Endpoint(_checked_url(value, wire.url_env), wire.url_env)


def _api_key(
    wire: ProviderKind, api_key: str | None, api_key_env: str | None, env: Mapping[str, str]
) -> str:
    if api_key is not None:
        return api_key
    if api_key_env:
        value = env.get(api_key_env)
        if value is None:
            raise ProviderSettingsError(f"api_key_env: {api_key_env} is not set")
        return value
    return env.get(wire.key_env, "")  # "": no key is sent (a local server)


def _ollama_options(
    extra: dict[str, Any],
    temperature: float | None,
    max_tokens: int | None,
    stop: Sequence[str] | None,
) -> dict[str, Any] | None:
    given = extra.pop("options", None) or {}
    if not isinstance(given, dict):
        raise ProviderSettingsError("extra options=... must be a JSON object (Ollama's options)")
    options: dict[str, Any] = dict(given)
    if temperature is not None:
        options["temperature"] = temperature
    if max_tokens is not None:
        options["num_predict"] = max_tokens
    if stop:
        options["stop"] = list(stop)
    return options or None


def open_provider(
    kind: str = "openai",
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    api_key_env: str | None = None,
    temperature: float | None = None,
    max_tokens: int | None = None,
    stop: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
    timeout: httpx.Timeout | float | None = None,
    limits: StreamLimits | None = None,
    retry: RetryPolicy | None = None,
    client: httpx.AsyncClient | None = None,
    trust_env: bool = True,
    environ: Mapping[str, str] | None = None,
) -> HTTPProvider:
    """The provider for protocol ``kind``, configured as the module docstring says.

    Use it as an async context manager (``async with open_provider(...) as
    provider``), or call its ``aclose()``: it owns its HTTP client unless
    ``client`` is given.

    Args:
        kind: ``openai`` (chat completions), ``ollama``, ``anthropic`` or
            ``openai-responses`` (see :data:`PROVIDER_KINDS`).
        base_url: the server; default the protocol's variable, else the vendor's.
        api_key: the key itself (``""``: send none); default ``api_key_env``.
        api_key_env: the variable holding the key; it must be set.
        temperature, max_tokens, stop: request fields, sent only if given
            (``max_tokens`` also sets the answer's share of the context
            window, unless the hub is given ``output_reserve``).
        extra: further request fields (for Ollama, ``options`` merges with
            the ones above).
        timeout: httpx timeouts; default the provider class's ``default_timeout``.
        limits: stream limits (default :class:`StreamLimits`).
        retry: opt-in retry before the first byte (default: none).
        client: an httpx client to share (not closed with the provider).
        trust_env: let an owned client read proxy settings from the environment.
        environ: the variables to read (default ``os.environ``).

    Raises:
        ProviderSettingsError: an unknown ``kind``, ``api_key_env`` not set,
            a base URL that is not ``http(s)://``, or request fields the
            protocol cannot send (the Responses API has no ``stop``).
    """
    wire = provider_kind(kind)
    env = os.environ if environ is None else environ
    endpoint = configured_endpoint(kind, base_url, env)
    url = DEFAULT_URLS[wire.name] if endpoint is None else endpoint.url
    key = _api_key(wire, api_key, api_key_env, env)
    fields = dict(extra or {})
    cls = wire.provider_class()
    common: dict[str, Any] = {
        "base_url": url,
        "api_key": key,
        "timeout": cls.default_timeout if timeout is None else timeout,
        "limits": limits,
        "retry": retry,
        "client": client,
        "trust_env": trust_env,
    }
    try:
        if wire.name == "ollama":
            options = _ollama_options(fields, temperature, max_tokens, stop)
            provider: HTTPProvider = cls(options=options, extra=fields or None, **common)
        else:
            provider = cls(
                temperature=temperature,
                max_tokens=max_tokens,
                stop=None if stop is None else list(stop),
                extra=fields or None,
                **common,
            )
    except ProviderSettingsError:
        raise
    except ValueError as exc:  # a field the protocol refuses (stop for Responses...)
        raise ProviderSettingsError(f"{wire.name}: {exc}") from None
    return provider


def _stop(value: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


def _kind(_: object, __: attrs.Attribute[str], value: str) -> None:
    provider_kind(value)


@attrs.frozen(kw_only=True)
class ProviderSettings:
    """The settings of :func:`open_provider`, as one typed value: what the
    command line's provider options build, and ``turnledger serve``'s
    :class:`~turnledger.serve.ServeOptions` hold. The key is never held,
    only the name of its variable."""

    kind: str = attrs.field(default="openai", validator=_kind)
    base_url: str | None = None
    api_key_env: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] | None = attrs.field(default=None, converter=_stop)
    extra: Mapping[str, Any] = attrs.field(factory=dict, hash=False)
    limits: StreamLimits | None = None
    retry: RetryPolicy | None = None

    def endpoint(self, environ: Mapping[str, str] | None = None) -> Endpoint | None:
        """The base URL these settings configure (see :func:`configured_endpoint`)."""
        return configured_endpoint(self.kind, self.base_url, environ)

    def open(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: httpx.Timeout | float | None = None,
        client: httpx.AsyncClient | None = None,
        trust_env: bool = True,
        environ: Mapping[str, str] | None = None,
    ) -> HTTPProvider:
        """:func:`open_provider` with these settings; ``base_url`` and
        ``api_key`` given here win (a loopback server's URL, and ``""``)."""
        return open_provider(
            self.kind,
            base_url=base_url or self.base_url,
            api_key=api_key,
            api_key_env=self.api_key_env,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            stop=self.stop,
            extra=self.extra,
            timeout=timeout,
            limits=self.limits,
            retry=self.retry,
            client=client,
            trust_env=trust_env,
            environ=environ,
        )
