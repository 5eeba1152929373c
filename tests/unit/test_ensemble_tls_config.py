"""zoo.cfg of a TLS-only ensemble (coordination/ensemble.py ``render_config``): a
``secureClientPort`` with Netty and PEM stores, client certificates required, no plaintext
client port, and the quorum over TLS once there are several nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pubsubd.coordination.ensemble import NETTY, NodePorts, render_config

pytestmark = pytest.mark.unit

ONE = [NodePorts(2281, 2888, 3888)]
THREE = [NodePorts(2281 + i, 2888 + i, 3888 + i) for i in range(3)]
STORES = (Path("/z/keystore.pem"), Path("/z/ca.pem"))


def _lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines())


def test_plaintext_by_default() -> None:
    cfg = _lines(render_config(Path("/d"), ONE[0], ONE))
    assert cfg["clientPort"] == "2281" and "secureClientPort" not in cfg


def test_tls_only_with_client_certificates() -> None:
    cfg = _lines(render_config(Path("/d"), ONE[0], ONE, STORES))
    assert "clientPort" not in cfg and "clientPortAddress" not in cfg
    assert cfg["secureClientPort"] == "2281" and cfg["secureClientPortAddress"] == "127.0.0.1"
    assert cfg["serverCnxnFactory"] == NETTY
    assert cfg["ssl.keyStore.location"] == "/z/keystore.pem"
    assert cfg["ssl.trustStore.location"] == "/z/ca.pem"
    assert cfg["ssl.keyStore.type"] == cfg["ssl.trustStore.type"] == "PEM"
    assert cfg["ssl.clientAuth"] == "need"
    assert "sslQuorum" not in cfg  # standalone: no quorum


def test_an_ensemble_runs_its_quorum_over_tls_too() -> None:
    cfg = _lines(render_config(Path("/d"), THREE[1], THREE, STORES))
    assert cfg["sslQuorum"] == "true"
    assert cfg["ssl.quorum.keyStore.location"] == "/z/keystore.pem"
    assert cfg["ssl.quorum.trustStore.location"] == "/z/ca.pem"
    assert cfg["server.2"] == "127.0.0.1:2889:3889"
