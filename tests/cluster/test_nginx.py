"""nginx in front of three serve nodes on one PostgreSQL: round robin,
Server-Sent Events passed on as they come, and a dead node left out."""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from turnledger.adapters.stores import PostgresStore
from turnledger.testing.cluster import Cluster, answer_for, nginx_config

pytestmark = [pytest.mark.postgres, pytest.mark.loopback, pytest.mark.slow]


async def _turn(
    client: httpx.AsyncClient, url: str, sid: str, question: str
) -> list[tuple[str, float]]:
    """POST a turn; each SSE event's name and arrival time."""
    seen: list[tuple[str, float]] = []
    async with client.stream(
        "POST", f"{url}/v1/sessions/{sid}/turns", json={"question": question}
    ) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                seen.append((line[7:], time.monotonic()))
    return seen


async def _owners(cluster: Cluster) -> dict[str, int]:
    store = await PostgresStore.open(cluster.dsn, read_only=True)
    try:
        return {lease.session_id: lease.pid for lease in await store.owners()}
    finally:
        await store.aclose()


@pytest.mark.timeout(180)
async def test_nginx_round_robins_streams_as_it_comes_and_leaves_a_dead_node_out(
    cluster_of: Callable[..., AbstractContextManager[Cluster]], nginx_binary: str
) -> None:
    with cluster_of(3, nginx=True) as cluster:
        assert cluster.nginx is not None
        proxy = cluster.nginx.url
        pids = {n.proc.pid: n for n in cluster.nodes}
        async with httpx.AsyncClient(timeout=30) as client:
            # Six new sessions one after the other: round robin gives each
            # node two (the node a session's first question reaches owns it).
            for i in range(6):
                events = await _turn(client, proxy, f"rr{i}", f"slow 5 0.2 rr{i}")
                names = [name for name, _ in events]
                assert names == ["turn"] + ["delta"] * 5 + ["outcome"], names
                # Not buffered: the first delta came about 0.8 s before the
                # outcome (the model spaces its five deltas 0.2 s apart).
                first = events[1][1]
                assert events[-1][1] - first > 0.5, events
            owners = await _owners(cluster)
            per_node = Counter(owners[f"rr{i}"] for i in range(6))
            assert set(per_node) == set(pids) and set(per_node.values()) == {2}, per_node
            # A node dies: nginx leaves it out (its connection is refused,
            # so the POST goes to the next node) and every question is answered.
            dead = cluster.nodes[1]
            dead.kill(signal.SIGKILL)
            for i in range(6):
                events = await _turn(client, proxy, f"after{i}", f"quick after{i}")
                assert [name for name, _ in events][-1] == "outcome"
                got = (await client.get(f"{proxy}/v1/sessions/after{i}")).json()
                assert [t["answer"] for t in got["turns"]] == [answer_for(f"quick after{i}")]
            owners = await _owners(cluster)
            after = {owners[f"after{i}"] for i in range(6)}
            assert after == {n.proc.pid for n in cluster.alive()}, (after, dead.proc.pid)
        log = (cluster.nginx.config.parent / "error.log").read_text()
        assert "Connection refused" in log and dead.url.removeprefix("http://") in log


def test_the_nginx_config_names_every_node_and_streams_unbuffered(tmp_path: Path) -> None:
    text = nginx_config(["127.0.0.1:1001", "127.0.0.1:1002"], listen="127.0.0.1:8080",
                        prefix=tmp_path)  # fmt: skip
    assert "server 127.0.0.1:1001 max_fails=1 fail_timeout=5s;" in text
    assert "server 127.0.0.1:1002 max_fails=1 fail_timeout=5s;" in text
    assert "listen 127.0.0.1:8080;" in text
    wanted = ["proxy_buffering off;", "proxy_http_version 1.1;", "daemon off;",
              "proxy_set_header Host 127.0.0.1;", "proxy_next_upstream error timeout;"]  # fmt: skip
    for line in wanted:
        assert line in text


def test_the_scaling_page_shows_the_config_the_tests_run() -> None:
    page = (Path(__file__).parents[2] / "docs" / "scaling.md").read_text(encoding="utf-8")
    [shown] = re.findall(r"```nginx\n(.*?)```", page, flags=re.DOTALL)
    upstreams = ["10.0.0.11:8421", "10.0.0.12:8421", "10.0.0.13:8421"]
    prefix = Path("/var/lib/turnledger-nginx")
    assert shown == nginx_config(upstreams, listen="8080", prefix=prefix, user="www-data")
