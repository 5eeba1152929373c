"""ZooKeeper for tests: one standalone node for the whole session, and a fresh root per test.

Register it in a test module with ``pytest_plugins = ["tests.support.zookeeper"]`` (and import
nothing from this module there: pytest must import it first, to rewrite its asserts). The node
runs from the Debian package (``make test`` installs it when missing); without it the fixture
fails with the command that installs it. Tests share the node and never see each other's data:
each works under its own root (the ``zk_root`` fixture), so nothing needs deleting between
tests.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from pubsubd.coordination.ensemble import Ensemble, ZooKeeperMissing, require_zookeeper


def unique_root() -> str:
    """A ZooKeeper root no other test uses."""
    return f"/t-{uuid.uuid4().hex}"


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ensemble]:
    """One standalone ZooKeeper node on a free loopback port, stopped after the session."""
    try:
        install = require_zookeeper()
    except ZooKeeperMissing as e:
        pytest.fail(str(e))
    ensemble = Ensemble(tmp_path_factory.mktemp("zookeeper"), nodes=1, install=install)
    ensemble.start()
    yield ensemble
    ensemble.stop()


@pytest.fixture
def zk_root() -> str:
    """A ZooKeeper root no other test uses."""
    return unique_root()
