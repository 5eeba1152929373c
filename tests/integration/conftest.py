"""Fixtures the Pulsar front's test modules share: one ``pubsubd serve --pulsar-port 0`` per
module, and a ``pulsar-client`` per test."""

from __future__ import annotations

from collections.abc import Iterator

import pulsar
import pytest

from tests.support.pulsar import make_client
from tests.support.server import ServerProcess


@pytest.fixture(scope="module")
def pulsar_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("pulsar") / "data", pulsar=True).start()
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def pulsar_url(pulsar_server: ServerProcess) -> str:
    assert pulsar_server.pulsar_port > 0
    return f"pulsar://127.0.0.1:{pulsar_server.pulsar_port}"


@pytest.fixture
def pulsar_client(pulsar_url: str) -> Iterator[pulsar.Client]:
    c = make_client(pulsar_url)
    yield c
    c.close()
