"""open_provider: one provider from a protocol name and a few settings, over
real HTTP to the testing kit's model servers; environment defaults as the
vendors' tools read them; typed errors before anything is built."""

from __future__ import annotations

from typing import Any

import pytest

from turnledger import ProviderSettingsError
from turnledger.adapters.providers import (
    PROVIDER_KINDS,
    ProviderSettings,
    RetryPolicy,
    StreamLimits,
    configured_endpoint,
    open_provider,
)
from turnledger.adapters.stores import MemoryStore
from turnledger.sessions import CommittedResult, DiscardedResult, open_hub
from turnledger.testing import (
    Exchange,
    error_reply,
    model_server,
    open_loopback_server,
    openai_stream_reply,
)

pytestmark = pytest.mark.loopback

KEY = "sk-factory-test-0123456789"

#: Where each protocol puts the answer's token cap in its request.
CAP_FIELD = {
    "openai": ("max_tokens",),
    "ollama": ("options", "num_predict"),
    "anthropic": ("max_tokens",),
    "openai-responses": ("max_output_tokens",),
}


def _key_sent(exchange: Exchange) -> str | None:
    return exchange.header("x-api-key") or exchange.header("authorization")


def _field(body: dict[str, Any], path: tuple[str, ...]) -> Any:
    for part in path:
        body = body[part]
    return body


async def _one_turn(provider: Any, **hub: Any) -> Any:
    async with provider, open_hub(MemoryStore(), provider, model="loopback", **hub) as h:
        turn = await h.submit("s", "Hello?")
        return await turn.outcome()


@pytest.mark.parametrize("kind", list(PROVIDER_KINDS))
async def test_each_kind_answers_a_turn_over_http(kind: str) -> None:
    async with open_loopback_server(model_server(kind, n_ctx=4000)) as server:  # type: ignore[arg-type]
        provider = open_provider(
            kind,
            base_url=server.base_url + PROVIDER_KINDS[kind].loopback_path,
            api_key_env="TL_FACTORY_KEY",
            max_tokens=64,
            temperature=0.5,
            trust_env=False,
            environ={"TL_FACTORY_KEY": KEY},
        )
        assert type(provider) is PROVIDER_KINDS[kind].provider_class()
        result = await _one_turn(provider, context_window=4000)
    assert isinstance(result, CommittedResult) and result.answer == "Noted."
    (exchange,) = server.exchanges
    assert (_key_sent(exchange) or "").endswith(KEY)
    body = exchange.json()
    assert _field(body, CAP_FIELD[kind]) == 64
    temperature = body["options"]["temperature"] if kind == "ollama" else body["temperature"]
    assert temperature == 0.5


@pytest.mark.parametrize(
    ("kind", "variables"),
    [
        ("openai", lambda s: {"OPENAI_BASE_URL": s.base_url + "/v1", "OPENAI_API_KEY": KEY}),
        # OLLAMA_HOST is often host:port, without a scheme.
        ("ollama", lambda s: {"OLLAMA_HOST": s.base_url.removeprefix("http://"),
                              "OLLAMA_API_KEY": KEY}),
        ("anthropic", lambda s: {"ANTHROPIC_BASE_URL": s.base_url, "ANTHROPIC_API_KEY": KEY}),
        ("openai-responses",
         lambda s: {"OPENAI_BASE_URL": s.base_url + "/v1", "OPENAI_API_KEY": KEY}),
    ],
)  # fmt: skip
async def test_the_environment_gives_the_url_and_the_key(kind: str, variables: Any) -> None:
    async with open_loopback_server(model_server(kind, n_ctx=4000)) as server:  # type: ignore[arg-type]
        env = variables(server)
        endpoint = configured_endpoint(kind, environ=env)
        assert endpoint is not None and endpoint.source == PROVIDER_KINDS[kind].url_env
        result = await _one_turn(open_provider(kind, trust_env=False, environ=env))
    assert isinstance(result, CommittedResult)
    (exchange,) = server.exchanges
    assert (_key_sent(exchange) or "").endswith(KEY)


async def test_an_explicit_empty_key_sends_none_whatever_the_environment() -> None:
    async with open_loopback_server(model_server("openai", n_ctx=4000)) as server:
        env = {"OPENAI_BASE_URL": server.openai_base_url, "OPENAI_API_KEY": KEY}
        result = await _one_turn(open_provider(api_key="", trust_env=False, environ=env))
    assert isinstance(result, CommittedResult)
    assert _key_sent(server.exchanges[0]) is None


def test_without_url_or_variable_each_kind_goes_to_its_vendor() -> None:
    urls = {
        kind: open_provider(kind, environ={}).url for kind in PROVIDER_KINDS
    }  # (a provider's client opens no connection until used)
    assert urls == {
        "openai": "https://api.openai.com/v1/chat/completions",
        "ollama": "http://127.0.0.1:11434/api/chat",
        "anthropic": "https://api.anthropic.com/v1/messages",
        "openai-responses": "https://api.openai.com/v1/responses",
    }


async def test_retry_and_limits_reach_the_provider() -> None:
    replies = [error_reply(503), openai_stream_reply("A long enough answer.")]
    async with open_loopback_server(replies) as server:
        retried = open_provider(
            base_url=server.openai_base_url,
            retry=RetryPolicy(attempts=2, base_delay=0.0),
            trust_env=False,
            environ={},
        )
        result = await _one_turn(retried)
    assert isinstance(result, CommittedResult) and len(server.exchanges) == 2
    async with open_loopback_server([openai_stream_reply("A long enough answer.")]) as server:
        limited = open_provider(
            base_url=server.openai_base_url,
            limits=StreamLimits(max_output_chars=5),
            trust_env=False,
            environ={},
        )
        result = await _one_turn(limited)
    assert isinstance(result, DiscardedResult) and result.reason == "limit"


async def test_settings_open_the_same_provider() -> None:
    settings = ProviderSettings(
        kind="ollama", api_key_env="TL_FACTORY_KEY", max_tokens=32, stop=["END"]
    )
    assert settings.stop == ("END",)
    async with open_loopback_server(model_server("ollama", n_ctx=4000)) as server:
        provider = settings.open(
            base_url=server.base_url, trust_env=False, environ={"TL_FACTORY_KEY": KEY}
        )
        result = await _one_turn(provider)
    assert isinstance(result, CommittedResult)
    options = server.exchanges[0].json()["options"]
    assert options["num_predict"] == 32 and options["stop"] == ["END"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: open_provider("gemini"), "unknown provider kind 'gemini' (known: openai, "),
        (lambda: ProviderSettings(kind="gemini"), "unknown provider kind 'gemini'"),
        (lambda: open_provider(api_key_env="TL_NOT_SET", environ={}),
         "api_key_env: TL_NOT_SET is not set"),
        (lambda: open_provider(base_url="ftp://example.com", environ={}),
         "base_url: not an http:// or https:// URL"),
        (lambda: open_provider("anthropic", environ={"ANTHROPIC_BASE_URL": "api.anthropic.com"}),
         "ANTHROPIC_BASE_URL: not an http:// or https:// URL"),
        (lambda: open_provider(base_url="http://127.0.0.1:99999", environ={}),
         "base_url: not a URL"),
        (lambda: open_provider("openai-responses", stop=["END"], environ={}),
         "openai-responses: the Responses API has no stop sequences"),
        (lambda: open_provider("ollama", extra={"options": [1]}, environ={}),
         "must be a JSON object"),
    ],
)  # fmt: skip
def test_settings_that_cannot_work_are_a_typed_error(call: Any, message: str) -> None:
    with pytest.raises(ProviderSettingsError) as raised:
        call()
    assert message in str(raised.value)
    assert isinstance(raised.value, ValueError)  # as a bad argument anywhere is


def test_a_key_in_a_bad_url_is_not_repeated() -> None:
    with pytest.raises(ProviderSettingsError) as raised:
        open_provider(base_url=f"ftp://h/?key={KEY}", environ={})
    assert KEY not in str(raised.value)
