"""The 22 cases of seed 002, rebuilt: byte-exact SSE bodies and the outcome
each must have (``commit`` or a discard reason).

The seed's table: 6 complete (read caps, line endings, multi-line data,
BOM/heartbeat); 16 fail or cancel. One deliberate difference: the seed files
"[DONE] without a finish_reason" under PROTOCOL; real servers send exactly
that when they cut a generation short, and issue 4 asks for it to be
reported as incomplete, so here it is ``incomplete_stream``.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from turnledger.testing import Reply, Stall, WritePause, error_reply

QUESTION = "Say hello in Chinese, then Java and a sprout."


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-seed",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "seed",
        "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}],
    }


def ev(obj: Any, eol: str = "\n") -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}{eol}{eol}".encode()


def content(text: str, eol: str = "\n") -> bytes:
    return ev(chunk({"content": text}), eol)


ROLE = ev(chunk({"role": "assistant"}))
STOP = ev(chunk({}, "stop"))
DONE = b"data: [DONE]\n\n"


def answer(*pieces: str, eol: str = "\n") -> bytes:
    return (
        ev(chunk({"role": "assistant"}), eol)
        + b"".join(content(p, eol) for p in pieces)
        + ev(chunk({}, "stop"), eol)
        + f"data: [DONE]{eol}{eol}".encode()
    )


@attrs.frozen
class Case:
    name: str
    reply: Reply
    #: "commit" or the discard reason.
    expect: str
    #: For commits: the answer.
    answer: str = ""
    cancel_after_chars: int | None = None
    read_timeout: float | None = None


def _sse(*parts: bytes | WritePause | Stall) -> Reply:
    return Reply(body=parts)


ONE_BYTE = answer("你好，", "Java 🌱")

CASES = [
    # -- complete: history grows by one pair
    Case("one_byte", _sse(ONE_BYTE), "commit", "你好，Java 🌱"),
    Case(
        "seven_byte",
        _sse(answer("Seven-byte reads ", "split 字节 ", "and 🌊 waves.")),
        "commit",
        "Seven-byte reads split 字节 and 🌊 waves.",
    ),
    Case("crlf", _sse(answer("你好，", "Java 🌱", eol="\r\n")), "commit", "你好，Java 🌱"),
    Case("bare_cr", _sse(answer("你好，", "Java 🌱", eol="\r")), "commit", "你好，Java 🌱"),
    Case(
        "multiline_data",
        _sse(
            ROLE,
            b'data: {\ndata: "choices":[{"index":0,"delta":{"content":"hello"},'
            b'"finish_reason":null}]}\n\n',
            STOP,
            DONE,
        ),
        "commit",
        "hello",
    ),
    Case(
        "bom_heartbeat",
        _sse(
            b"\xef\xbb\xbf: ping - 2024-01-01T00:00:00Z\n\n",
            ROLE,
            b":\n",
            content("你好，"),
            b": ping - 2024-01-01T00:00:15Z\n\n",
            content("Java 🌱"),
            STOP,
            b": ping\n",
            DONE,
        ),
        "commit",
        "你好，Java 🌱",
    ),
    # -- fail: history unchanged
    Case("missing_done", _sse(ROLE, content("partial preview"), STOP), "incomplete_stream"),
    Case(
        "unterminated_done",
        _sse(ROLE, content("looks finished"), STOP, b"data: [DONE]\n"),
        "incomplete_stream",
    ),
    Case("done_without_finish", _sse(ROLE, content("cut short"), DONE), "incomplete_stream"),
    Case("text_after_stop", _sse(ROLE, content("Hi"), STOP, content(" more"), DONE), "protocol"),
    Case(
        "tool_delta",
        _sse(
            ROLE,
            ev(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": ""},
                            }
                        ]
                    }
                )
            ),
            ev(chunk({}, "tool_calls")),
            DONE,
        ),
        "protocol",
    ),
    Case(
        "length_finish",
        _sse(ROLE, content("The whole test string is visible."), ev(chunk({}, "length")), DONE),
        "incomplete_finish",
    ),
    Case(
        "provider_error_event",
        _sse(
            ROLE,
            content("Hal"),
            b'data: {"error":{"message":"upstream failed at /srv/app/model.py",'
            b'"type":"server_error"}}\n\n',
        ),
        "provider_error",
    ),
    Case(
        "malformed_json",
        _sse(ROLE, b'data: {"choices":[{"index":0,"delta":{"content":"x"}\n\n', STOP, DONE),
        "malformed",
    ),
    Case(
        "duplicate_key",
        _sse(
            ROLE,
            b'data: {"choices":[{"index":0,"delta":{"content":"a","content":"b"},'
            b'"finish_reason":null}]}\n\n',
            STOP,
            DONE,
        ),
        "malformed",
    ),
    Case(
        "invalid_utf8",
        _sse(
            ROLE,
            content("ok ") + b'data: {"choices":[{"index":0,"delta":{"content":"\xc0\xaf"}}]}\n\n',
            STOP,
            DONE,
        ),
        "malformed",
    ),
    Case("oversized_line", _sse(ROLE, content("x" * 9000), STOP, DONE), "limit"),
    Case(
        "oversized_output",
        _sse(ROLE, *(content("y" * 1000) for _ in range(5)), STOP, DONE),
        "limit",
    ),
    Case(
        "wrong_mime",
        Reply(media_type="text/html", body=(b"<html>" + ONE_BYTE + b"</html>",)),
        "protocol",
    ),
    Case(
        "http_503",
        error_reply(503, '{"error":"overloaded","trace":"/srv/app/server.py line 42"}'),
        "http_status",
    ),
    Case(
        "cancelled",
        _sse(ROLE, content("Java"), WritePause(0.3), content(" keeps going"), Stall()),
        "cancelled",
        cancel_after_chars=3,
    ),
    Case(
        "read_timeout",
        _sse(WritePause(0.4), ONE_BYTE),
        "timeout",
        read_timeout=0.1,
    ),
]

assert len(CASES) == 22
assert sum(c.expect == "commit" for c in CASES) == 6
