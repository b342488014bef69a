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

2. Per turn of ``benchmarks/actors.py``'s hub (200 sessions, 10 turns
   each, instant provider, logs at DEBUG), one structlog configuration after
   another, interleaved: filtered at WARNING (the baseline); every line
   built and handed to structlog, then dropped by its first processor (what
   the library's side of a line costs, with structlog's call); context and
   level merged and rendered as ``""`` (then printed to /dev/null);
   rendered by orjson; by ``json.dumps`` (``actors.py``'s configuration);
   and ``configure_logging(json=True)`` as it was (json.dumps) and as it is
   (orjson), at DEBUG (``verbosity=1``) and at INFO (the transitions only,
   what the command line writes to a pipe).

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

from turnledger.adapters.logging import configure_logging
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


def _configure(*processors: Any) -> Callable[[], None]:
    def configure() -> None:
        structlog.configure(
            processors=list(processors),
            wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
            logger_factory=structlog.PrintLoggerFactory(open(os.devnull, "w")),  # noqa: SIM115
        )

    return configure


def _drop(_: Any, __: str, event_dict: Any) -> Any:
    raise structlog.DropEvent


def _nothing(_: Any, __: str, event_dict: Any) -> str:
    return ""


def _orjson_text(obj: Any, **_: Any) -> str:
    return orjson.dumps(obj).decode()


def _cli_json_before(level: int = logging.DEBUG) -> None:
    # configure_logging(json=True) as it was, json.dumps renderer.
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(ensure_ascii=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(open(os.devnull, "w")),  # noqa: SIM115
    )


def _cli_json_now(verbosity: int = 1) -> None:
    configure_logging(json=True, verbosity=verbosity, stream=open(os.devnull, "w"))  # noqa: SIM115


def log_floor(rounds: int) -> None:
    sessions, turns = 200, 10
    total = sessions * turns
    merge = structlog.contextvars.merge_contextvars
    level = structlog.processors.add_log_level
    variants: dict[str, Callable[[], None]] = {
        "logs filtered (WARNING)": actors.quiet_logs,
        "every line, dropped by the first processor": _configure(_drop),
        "every line, context + level, rendered as ''": _configure(merge, level, _nothing),
        "every line, context + level, orjson": _configure(
            merge, level, structlog.processors.JSONRenderer(serializer=_orjson_text)
        ),
        "every line as JSON (actors.py: json.dumps)": actors.json_logs_to_devnull,
        "configure_logging(json, -v), before": _cli_json_before,
        "configure_logging(json, -v), now": _cli_json_now,
        "configure_logging(json), INFO, before": lambda: _cli_json_before(logging.INFO),
        "configure_logging(json), INFO, now": lambda: _cli_json_now(0),
    }
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, configure in variants.items():
            configure()
            cpu[name].append(actors.hub_turns(sessions, turns)[1])
    actors.quiet_logs()

    out = io.StringIO()
    structlog.configure(
        processors=[structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(out),
    )
    actors.hub_turns(sessions, turns)
    actors.quiet_logs()
    names = collections.Counter(json.loads(line)["event"] for line in out.getvalue().splitlines())
    per_turn = sum(names.values()) / total

    print(f"\n2. Logs at DEBUG, {sessions} sessions x {turns} turns through one hub, CPU per turn:")
    detail = ", ".join(f"{k} {v / total:.2f}" for k, v in names.most_common())
    print(f"   lines per turn: {per_turn:.2f} ({detail})")
    base = statistics.median(cpu["logs filtered (WARNING)"]) / total
    for name, ts in cpu.items():
        t = statistics.median(ts) / total
        print(f"   {name:45s} {t * 1e6:6.1f} µs  {t / base:4.2f}x  (+{(t - base) * 1e6:5.1f} µs)")
    print(
        f"   the 1.15x goal leaves {base * 0.15 * 1e6:.1f} µs a turn,"
        f" {base * 0.15 / per_turn * 1e6:.1f} µs a line"
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
