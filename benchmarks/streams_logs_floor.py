"""Where the time of a streamed chunk and of a logged turn goes: the floors.

Two goals of the performance campaign are set against a baseline rather
than a floor: SSE decode + strict JSON at 2.5x httpx-sse with ``json.loads``,
and every log line as JSON within 1.15x of logs filtered at WARNING. This
script measures each part alone, in CPU time (``time.process_time``: on a
shared machine wall-clock time measures the neighbours), medians of
interleaved rounds, so the budget a goal leaves can be set against what the
parts it cannot do without already cost.

1. Per event of ``benchmarks/streaming.py``'s stream (one read per event):
   httpx-sse's decoders + ``json.loads``, turnledger's ``SSEDecoder`` +
   ``loads_strict``, and the parts: the SSE decoder alone, ``orjson.loads``
   alone (the fastest parser there is, with no strict check at all), the
   strict checks (``loads_strict`` minus ``orjson.loads``).

2. Per log line and per turn of ``benchmarks/actors.py``'s hub (200
   sessions, 10 turns each, instant provider): the lines a turn writes at
   DEBUG, the cost of one line through the benchmark's structlog
   configuration (``merge_contextvars``, ``add_log_level``,
   ``JSONRenderer``), through the same with a renderer that writes nothing
   (structlog's own floor), and with orjson as the serializer.

    python benchmarks/streams_logs_floor.py [--rounds N]
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import structlog

sys.path.insert(0, str(Path(__file__).parent))

import actors
import streaming

from turnledger.adapters.providers import SSEDecoder, loads_strict


def cpu_medians(variants: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """CPU seconds per call of each variant, median of interleaved rounds."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.process_time()
            fn()
            times[name].append(time.process_time() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def sse_floor(chunks: int, rounds: int) -> None:
    wire, _ = streaming.make_stream(chunks)
    texts = [w[6:-2].decode() for w in wire[:-1]]
    loads = orjson.loads

    def decoder_alone() -> None:
        d = SSEDecoder()
        for read in wire:
            d.decode(read)

    medians = cpu_medians(
        {
            "httpx-sse decoders + json.loads": lambda: streaming.httpx_sse_decoders(wire),
            "turnledger SSEDecoder + loads_strict": lambda: streaming.ours(wire),
            "  SSEDecoder alone": decoder_alone,
            "  loads_strict alone": lambda: [loads_strict(t) for t in texts],
            "  orjson.loads alone": lambda: [loads(t) for t in texts],
            "  json.loads alone": lambda: [json.loads(t) for t in texts],
        },
        rounds,
    )
    n = len(texts)
    print(f"1. SSE decode + JSON parse, {n:,} events, one read per event, CPU µs/event:")
    for name, t in medians.items():
        print(f"   {name:38s} {t / n * 1e6:6.2f}")
    base = medians["httpx-sse decoders + json.loads"] / n
    ours = medians["turnledger SSEDecoder + loads_strict"] / n
    floor = (medians["  SSEDecoder alone"] + medians["  orjson.loads alone"]) / n
    checks = (medians["  loads_strict alone"] - medians["  orjson.loads alone"]) / n
    print(f"   ratio now {base / ours:.2f}x; the 2.5x goal leaves {base / 2.5 * 1e6:.2f} µs/event")
    print(
        f"   SSEDecoder + orjson.loads with no strict check: {floor * 1e6:.2f} µs/event"
        f" ({base / floor:.2f}x); the strict checks add {checks * 1e6:.2f} µs/event"
    )


def _json_config(serializer: Any = None, render: bool = True) -> None:
    renderer: Any
    if not render:

        def renderer(_: Any, __: str, event_dict: Any) -> str:
            return ""
    elif serializer is None:
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.processors.JSONRenderer(serializer=serializer)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(open(os.devnull, "w")),  # noqa: SIM115
    )


def _orjson_text(obj: Any, **_: Any) -> str:
    return orjson.dumps(obj).decode()


def _line_cost(configure: Callable[[], None], lines: int, rounds: int) -> float:
    configure()
    log = structlog.get_logger("turnledger.sessions").bind(session_id="s1")

    def run() -> None:
        for _ in range(lines):
            log.debug(
                "message_received",
                msg_type="Submit",
                in_flight=None,
                request_id="r1",
                stale=False,
                question_chars=10,
            )

    return cpu_medians({"": run}, rounds)[""] / lines


def log_floor(rounds: int) -> None:
    sessions, turns = 200, 10
    total = sessions * turns
    quiet: list[float] = []
    logged: list[float] = []
    for _ in range(rounds):
        actors.quiet_logs()
        quiet.append(actors.hub_turns(sessions, turns)[1])
        actors.json_logs_to_devnull()
        logged.append(actors.hub_turns(sessions, turns)[1])
    turn_q = statistics.median(quiet) / total
    turn_j = statistics.median(logged) / total

    out = io.StringIO()
    structlog.configure(
        processors=[structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(out),
    )
    actors.hub_turns(sessions, turns)
    names = collections.Counter(json.loads(line)["event"] for line in out.getvalue().splitlines())
    per_turn = sum(names.values()) / total

    n = 20_000
    line_json = _line_cost(_json_config, n, rounds)
    line_none = _line_cost(lambda: _json_config(render=False), n, rounds)
    line_orjson = _line_cost(lambda: _json_config(_orjson_text), n, rounds)
    actors.quiet_logs()
    line_quiet = _line_cost(actors.quiet_logs, n, rounds)

    print(f"\n2. Logs, {sessions} sessions x {turns} turns through one hub, CPU:")
    print(
        f"   turn, logs filtered (WARNING) {turn_q * 1e6:6.1f} µs;"
        f" every line as JSON {turn_j * 1e6:6.1f} µs; ratio {turn_j / turn_q:.2f}x"
    )
    detail = ", ".join(f"{k} {v / total:.2f}" for k, v in names.most_common())
    print(f"   lines per turn at DEBUG: {per_turn:.2f} ({detail})")
    print(
        f"   one line: filtered {line_quiet * 1e6:.2f} µs; JSONRenderer {line_json * 1e6:.2f} µs;"
        f" orjson serializer {line_orjson * 1e6:.2f} µs;"
        f" structlog with an empty renderer {line_none * 1e6:.2f} µs"
    )
    for label, line in (
        ("JSONRenderer", line_json),
        ("orjson", line_orjson),
        ("empty renderer", line_none),
    ):
        print(
            f"   floor with {label:14s} (turn + lines x line, no field built):"
            f" {(turn_q + per_turn * line) / turn_q:.2f}x"
        )
    print(
        f"   the rest, building the fields and the transitions: "
        f"{(turn_j - turn_q - per_turn * line_json) * 1e6:.1f} µs/turn;"
        f" the 1.15x goal leaves {turn_q * 0.15 * 1e6:.1f} µs/turn"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=2_000)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, structlog {structlog.__version__}")
    sse_floor(args.chunks, args.rounds)
    log_floor(args.rounds)


if __name__ == "__main__":
    main()
