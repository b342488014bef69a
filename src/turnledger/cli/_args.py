"""Argument types of the parser: each refuses a bad value as a usage error
(exit 2) before anything is opened."""

from __future__ import annotations

import argparse
import json
import urllib.parse
from collections.abc import Callable
from typing import Any

from ._display import visible

__all__ = ["at_least", "http_url", "key_json", "positive", "text_arg"]


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
