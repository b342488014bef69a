"""run_serve runs from a typed ServeOptions, and refuses options that cannot
work before anything is opened or bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnledger import ProviderSettings
from turnledger.serve import ServeOptions, ServeOptionsError, ServeSettings, run_serve
from turnledger.sessions import RetentionPolicy


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"host": "0.0.0.0"}, "binding 0.0.0.0 requires a token"),
        ({"provider": ProviderSettings(base_url="http://127.0.0.1:9/v1")},
         r"--model is required with an endpoint \(from --base-url\)"),
        ({"context_window": 100, "output_reserve": 100},
         "--output-reserve must be below --context-window"),
        ({"app": ServeSettings(max_starting=-1)}, "--max-starting must be 0"),
        ({"header_timeout": 0.0}, "--header-timeout must be more than 0 seconds"),
        ({"retention": RetentionPolicy(max_turns=3), "prune_every": 0.0},
         "--prune-every must be more than 0 seconds"),
        ({"app": ServeSettings(allowed_origins=frozenset({"ftp://x"}))}, "--allow-origin: "),
        ({"app": ServeSettings(token="  ")}, "--token-env: the token is blank"),
        ({"app": ServeSettings(token="a b")}, "the token has spaces or control characters"),
        ({"model": "m", "provider": ProviderSettings(base_url="http://127.0.0.1:9/v1",
                                                     api_key_env="TL_NOT_SET_ANYWHERE")},
         "--api-key-env: TL_NOT_SET_ANYWHERE is not set"),
        ({"model": "m", "provider": ProviderSettings(kind="openai-responses", stop=["END"],
                                                     base_url="http://127.0.0.1:9/v1")},
         "the Responses API has no stop sequences"),
    ],
)  # fmt: skip
async def test_options_that_cannot_work_open_nothing(
    changes: dict[str, object], message: str, tmp_path: Path
) -> None:
    db = tmp_path / "never.db"
    options = ServeOptions(db=str(db), port=0, **changes)  # type: ignore[arg-type]
    with pytest.raises(ServeOptionsError, match=message):
        await run_serve(options)
    assert not db.exists()


async def test_the_providers_variable_is_an_endpoint_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:9")
    options = ServeOptions(db=str(tmp_path / "x.db"), provider=ProviderSettings(kind="ollama"))
    with pytest.raises(ServeOptionsError, match=r"an endpoint \(from OLLAMA_HOST\)"):
        await run_serve(options)
    monkeypatch.setenv("OLLAMA_HOST", "ftp://127.0.0.1:9")
    with pytest.raises(ServeOptionsError, match="OLLAMA_HOST: not an http"):
        await run_serve(options)


async def test_without_a_base_url_an_endpoint_is_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ServeOptionsError, match="--base-url is required"):
        await run_serve(ServeOptions(db=str(tmp_path / "x.db")))
