"""chat, serve and demo take their provider and budget options from one
argument group, so serve takes every such option chat takes, with the same
types, defaults and help; serve runs from the typed ServeOptions the command
line builds."""

from __future__ import annotations

import argparse

import pytest

from turnledger import ProviderSettings, Window
from turnledger.cli import _parser
from turnledger.cli._args import PROVIDER_OPTIONS
from turnledger.cli._errors import Exit
from turnledger.cli._serve import serve_options
from turnledger.serve import ServeOptions, ServeSettings
from turnledger.sessions import RetentionPolicy


def _command(name: str) -> argparse.ArgumentParser:
    parser = _parser([name])
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    command: argparse.ArgumentParser = sub.choices[name]
    return command


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def _group(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    (group,) = [g for g in parser._action_groups if g.title == PROVIDER_OPTIONS]
    return {s: a for a in group._group_actions for s in a.option_strings}


def _shape(action: argparse.Action) -> tuple[object, ...]:
    kind = getattr(action.type, "__qualname__", action.type)
    return (type(action), action.dest, kind, action.default, action.choices, action.help)


def test_serve_takes_every_provider_and_budget_option_chat_takes() -> None:
    chat, serve = _command("chat"), _command("serve")
    shared = _group(chat)
    assert {"--context-window", "--output-reserve", "--window", "--max-tokens",
            "--temperature", "--stop", "--param"} <= set(shared)  # fmt: skip
    assert {o: _shape(a) for o, a in _group(serve).items()} == {
        o: _shape(a) for o, a in shared.items()
    }
    # Every option of chat's outside the group is serve's too, but for the
    # ones that pick chat's session.
    only_chat = set(_options(chat)) - set(_options(serve))
    assert only_chat == {"--session", "--new"}


def test_demo_takes_the_protocol_from_the_same_group() -> None:
    demo, chat = _command("demo"), _command("chat")
    assert set(_group(demo)) == {"--provider"}
    assert _group(demo)["--provider"].choices == _group(chat)["--provider"].choices


def _serve_options(*extra: str) -> ServeOptions:
    argv = ["serve", "--db", "s.db", *extra]
    return serve_options(_parser(argv).parse_args(argv))


def test_the_command_line_builds_serve_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TL_SERVE_TOKEN", "t0ken")
    options = _serve_options(
        "--provider", "ollama", "--base-url", "http://127.0.0.1:11434", "--model", "llama3",
        "--api-key-env", "MY_KEY", "--context-window", "8192", "--output-reserve", "512",
        "--window", "4", "--max-tokens", "100", "--temperature", "0.3", "--stop", "END",
        "--param", "seed=7", "--timeout", "30", "--idle-timeout", "9", "--max-request-bytes",
        "9000", "--max-prompt-tokens", "2000", "--token-env", "TL_SERVE_TOKEN",
        "--max-starting", "4", "--system", "Be brief.", "--on-busy", "supersede",
        "--header-timeout", "3", "--allow-origin", "http://localhost:3000",
        "--prune-max-turns", "50", "--prune-every", "60",
    )  # fmt: skip
    assert options == ServeOptions(
        db="s.db",
        provider=ProviderSettings(
            kind="ollama",
            base_url="http://127.0.0.1:11434",
            api_key_env="MY_KEY",
            temperature=0.3,
            max_tokens=100,
            stop=("END",),
            extra={"seed": 7},
        ),
        model="llama3",
        system="Be brief.",
        on_busy="supersede",
        history_window=4,
        max_request_bytes=9000,
        max_prompt_tokens=2000,
        context_window=8192,
        output_reserve=512,
        turn_deadline=30.0,
        idle_timeout=9.0,
        header_timeout=3.0,
        retention=RetentionPolicy(max_turns=50),
        prune_every=60.0,
        app=ServeSettings(
            token="t0ken", max_starting=4, allowed_origins=frozenset({"http://localhost:3000"})
        ),
    )
    assert Window(options.history_window or 0) == Window(4)


def test_a_token_variable_that_is_not_set_is_a_usage_error() -> None:
    with pytest.raises(Exit) as raised:
        _serve_options("--token-env", "TL_NOT_SET_ANYWHERE")
    assert raised.value.code == 2 and "TL_NOT_SET_ANYWHERE is not set" in str(raised.value.message)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--context-window", "100", "--output-reserve", "100"),
         "--output-reserve must be below --context-window"),
        (("--max-tokens", "0"), "must be at least 1"),
        (("--window", "0"), "must be a positive number"),
    ],
)  # fmt: skip
def test_serve_refuses_bad_budgets_as_chat_does(
    extra: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises((SystemExit, Exit)) as raised:
        _serve_options(*extra)
    code = getattr(raised.value, "code", None)
    assert code == 2
    shown = getattr(raised.value, "message", "") or capsys.readouterr().err
    assert message in shown
