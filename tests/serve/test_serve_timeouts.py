"""The model server's HTTP read timeout never cuts a turn shorter than
``--idle-timeout`` says it may wait."""

from __future__ import annotations

import pytest

from turnledger.cli import _parser
from turnledger.cli._serve import serve_options
from turnledger.serve import ServeOptions
from turnledger.serve._server import _client


def _options(*extra: str) -> ServeOptions:
    argv = ["serve", "--db", "x.db", *extra]
    return serve_options(_parser(argv).parse_args(argv))


@pytest.mark.parametrize("provider", ["openai", "ollama", "anthropic", "openai-responses"])
def test_a_longer_idle_timeout_widens_the_read_timeout(provider: str) -> None:
    # A loaded service can wait longer than the provider's default 60 s read
    # timeout for a first byte; that used to end the turn as a provider
    # "read timeout" although --idle-timeout allowed 600 s.
    client = _client(_options("--provider", provider, "--idle-timeout", "600"))
    assert client.timeout.read == 600
    assert client.timeout.connect == 10.0


def test_a_short_idle_timeout_keeps_the_default_read_timeout() -> None:
    client = _client(_options("--idle-timeout", "5"))
    assert client.timeout.read == 60.0
