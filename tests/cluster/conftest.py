"""The cluster tests' fixtures: nginx (Debian's package; ``.ci/run`` installs
it, and with TURNLEDGER_REQUIRE_NGINX=1 a missing nginx fails the tests
rather than skipping them), and a cluster on a fresh PostgreSQL schema."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from turnledger.testing.cluster import Cluster, find_nginx, open_cluster

#: The issue's 300 clients by default; TURNLEDGER_CLUSTER_CLIENTS=N for fewer
#: (or more) on a machine where 300 do not fit in the test's time.
CLIENTS = int(os.environ.get("TURNLEDGER_CLUSTER_CLIENTS", "300"))


@pytest.fixture
def nginx_binary() -> str:
    found = find_nginx()
    if found is None:
        if os.environ.get("TURNLEDGER_REQUIRE_NGINX") == "1" or os.environ.get("CI") == "true":
            pytest.fail("nginx must be installed in CI (.ci/run installs Debian's package)")
        pytest.skip("nginx is not installed (.ci/run installs it: apt-get install nginx)")
    return found


@pytest.fixture
def cluster_of(
    pg_dsn: str, tmp_path: Path
) -> Iterator[Callable[..., AbstractContextManager[Cluster]]]:
    """``cluster_of(nodes, nginx=...)``: a cluster on this test's schema."""

    def make(
        nodes: int, *, nginx: bool, node_args: tuple[str, ...] = ()
    ) -> AbstractContextManager[Cluster]:
        # A model that stays silent for a while is the loaded machine, not
        # the model: the turns wait for it rather than time out.
        args = ("--idle-timeout", "120", *node_args)
        return open_cluster(pg_dsn, tmp_path / "cluster", nodes, nginx=nginx, node_args=args)

    yield make
