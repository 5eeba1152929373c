"""Fixtures: a real pubsubd process per test (or module) and official clients pointed at it."""

from __future__ import annotations

import contextlib
import os
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.api_core.retry import retry_base as retry_base_module
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.subscriber._protocol import leaser as leaser_module
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from pubsubd.cluster.launcher import LocalCluster
from tests.support import process as process_module
from tests.support.cluster import ClusterServer, running_cluster
from tests.support.server import ServerProcess

PROJECT = "test-project"

# Every server a test starts has the Pulsar front off unless the test turns it on (an ephemeral
# port): the default, 6650, would collide between servers running side by side.
os.environ.setdefault("PUBSUBD_PULSAR_PORT", "-1")

# The official client's background threads (the leaser's jitter, api_core's retry backoff)
# draw from the global `random`. One still retrying after its test (a publisher against a
# server the test killed) would then move the global state under hypothesis, which reads that
# as "random inside a strategy" and fails a property test that did nothing wrong. Give those
# modules generators of their own.
leaser_module.random = random.Random()  # type: ignore[assignment]
retry_base_module.random = random.Random()  # type: ignore[assignment]


# With `make test` (two xdist workers, `-n 2 --dist loadgroup --no-loadscope-reorder`) every
# test is given a group, and a group runs whole on one worker:
# - "heavy": whole local clusters and Spark JVMs (tests/cluster, tests/spark), one at a time;
# - "deployments": the feature tests of every deployment (the `shared_server` fixture), so one
#   worker starts the session's two clusters once (the Spark source and sink tests among them);
# - otherwise a group per file.
# Groups go out in the order below (heavy first: it is the longest, ~half the suite), then the
# collection order; the other worker takes everything else meanwhile.
# The groups held nowhere before 2026-11-27, for two reasons: pytest-xdist 3.8 writes a test's
# group into its id in its own collection hook, which ran before this one (no marker yet: hence
# tryfirst below), and pytest 9.2 no longer reads ids from where xdist writes them (pyproject
# pins pytest below 9 until xdist follows). Two heavy tests then ran at once.
GROUP_ORDER = ("heavy", "deployments", "crash")
HEAVY = ("cluster", "spark")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Kill what the test body started and left running: a test that failed before its own
    cleanup leaves no server behind (fixtures stop theirs at teardown)."""
    before = len(process_module.LAUNCHED)
    try:
        return (yield)
    finally:
        started = process_module.LAUNCHED[before:]
        del process_module.LAUNCHED[before:]
        for leftover in started:
            leftover.kill()


def _group(item: pytest.Item) -> str:
    parts = item.path.relative_to(Path(__file__).parent).parts
    if "shared_server" in getattr(item, "fixturenames", ()):
        return "deployments"
    if parts[0] in HEAVY:
        return "heavy"
    return "/".join(parts)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    groups = {item: _group(item) for item in items}
    rank = {group: index for index, group in enumerate(GROUP_ORDER)}

    def order(item: pytest.Item) -> int:
        group = groups[item]
        return rank.get(group, rank.get(group.split("/")[0], len(GROUP_ORDER)))

    items.sort(key=order)  # stable: within a rank, the collection order
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item]))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A fresh pubsubd on an ephemeral port with its own data dir; stopped after the test."""
    srv = ServerProcess(tmp_path / "data").start()
    yield srv
    srv.kill()


# The deployments the google.pubsub.v1 feature tests run against: one process with embedded
# storage; a cluster (ZooKeeper, 3 storage nodes, serve --cluster, a router, and a frontend
# the clients connect to); and a cluster whose topics two forwarders share (pubsubd forwarder
# x2 instead of serve). PUBSUBD_TEST_DEPLOYMENTS narrows it (e.g. "embedded" for a quick run).
DEPLOYMENTS = os.environ.get("PUBSUBD_TEST_DEPLOYMENTS", "embedded,cluster,forwarders").split(",")


@pytest.fixture(scope="session")
def test_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One local cluster for the whole session (started by the first test that needs it)."""
    with running_cluster(tmp_path_factory.mktemp("cluster"), routers=1, frontends=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def test_forwarders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster whose topics are shared by two forwarders (``pubsubd forwarder``)."""
    directory = tmp_path_factory.mktemp("forwarders")
    with running_cluster(directory, routers=1, frontends=1, forwarders=2) as cluster:
        yield cluster


@pytest.fixture(scope="module", params=DEPLOYMENTS)
def shared_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess | ClusterServer]:
    """One pubsubd for a whole module (tests use unique names), in each deployment."""
    if request.param == "cluster":
        yield ClusterServer(request.getfixturevalue("test_cluster"))
        return
    if request.param == "forwarders":
        yield ClusterServer(request.getfixturevalue("test_forwarders"))
        return
    srv = ServerProcess(tmp_path_factory.mktemp("shared") / "data").start()
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def clients(
    shared_server: ServerProcess | ClusterServer,
) -> Iterator[tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient]]:
    """An official publisher and subscriber on the module's shared server, for the module."""
    pub = make_publisher(shared_server.endpoint)
    sub = make_subscriber(shared_server.endpoint)
    yield pub, sub
    sub.close()


@contextlib.contextmanager
def emulator_host(endpoint: str) -> Iterator[None]:
    """PUBSUB_EMULATOR_HOST set while a client is built: the way users point clients at us."""
    old = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = endpoint
    try:
        yield
    finally:
        if old is None:
            del os.environ["PUBSUB_EMULATOR_HOST"]
        else:
            os.environ["PUBSUB_EMULATOR_HOST"] = old


def make_publisher(endpoint: str, **kwargs: Any) -> pubsub_v1.PublisherClient:
    with emulator_host(endpoint):
        return pubsub_v1.PublisherClient(**kwargs)


def make_subscriber(
    endpoint: str, big_messages: bool = False, fresh_connection: bool = False
) -> pubsub_v1.SubscriberClient:
    """The official subscriber for ``endpoint``. ``fresh_connection``: its own connection, not
    the one gRPC shares between the process's channels to the same address, which after a
    server's kill -9 waits out the reconnect backoff (up to ~10 s) before it tries again."""
    if big_messages or fresh_connection:
        options: list[tuple[str, int]] = [("grpc.max_receive_message_length", -1)]
        if fresh_connection:
            options.append(("grpc.use_local_subchannel_pool", 1))
        channel = grpc.insecure_channel(endpoint, options=options)
        return _Subscriber(transport=SubscriberGrpcTransport(channel=channel))
    with emulator_host(endpoint):
        return _Subscriber()


class _Subscriber(pubsub_v1.SubscriberClient):  # type: ignore[misc]
    """The official subscriber, whose ``close`` first ends its ``subscribe`` streams and waits
    for their threads: ``future.cancel()`` only starts the stream's shutdown in a thread, and a
    channel closed before it ends lets the client's lease thread call a closed channel (an
    unhandled thread exception, which fails whichever test runs then)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._streams: list[pubsub_v1.subscriber.futures.StreamingPullFuture] = []

    def subscribe(self, *args: Any, **kwargs: Any) -> Any:
        future = super().subscribe(*args, **kwargs)
        self._streams.append(future)
        return future

    def close(self) -> None:
        for future in self._streams:
            future.cancel()
            with contextlib.suppress(Exception):
                future.result(timeout=30)
        super().close()


@pytest.fixture
def names() -> Any:
    """Unique topic/subscription names for one test."""

    class Names:
        def __init__(self) -> None:
            self.suffix = uuid.uuid4().hex[:10]

        def topic(self, tag: str = "topic") -> str:
            return f"projects/{PROJECT}/topics/{tag}-{self.suffix}"

        def subscription(self, tag: str = "sub") -> str:
            return f"projects/{PROJECT}/subscriptions/{tag}-{self.suffix}"

    return Names()
