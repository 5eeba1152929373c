"""TLS settings of a process's listeners and clients: the PEM files, read and checked once.

A server has a certificate chain and its key (``--tls-cert``, ``--tls-key``) and, for mutual
TLS, the CA its clients' certificates must chain to (``--tls-client-ca``): then a client that
shows no certificate, or one the CA did not sign, is refused during the handshake. The same
files serve every listener of the process: gRPC (``api/grpc/tls.py`` makes grpcio's
credentials from :meth:`ServerTls.pems`), and the HTTP and Pulsar ports (asyncio servers over
:meth:`ServerTls.context`).

In a cluster, the process's clients of the other processes (storage nodes' gRPC and append
ports, other forwarders, the frontends' proxy) trust ``--tls-ca`` and show the process's own
certificate to listeners that ask for one: :data:`INTERNAL` (a :class:`ClientTls`).

Every process's ZooKeeper sessions (``coordination/zk.py``) follow :data:`ZOOKEEPER` the same
way (``--zk-tls-ca``, ``--zk-tls-cert``, ``--zk-tls-key``): with it, they connect to ZooKeeper's
``secureClientPort`` over TLS, showing that certificate when ZooKeeper asks for one.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "INTERNAL",
    "ZOOKEEPER",
    "ClientTls",
    "InternalClients",
    "ServerTls",
    "client_context",
]


@dataclass(frozen=True)
class ServerTls:
    cert: Path  # PEM: the server's certificate, then any intermediates
    key: Path  # PEM: its private key (unencrypted)
    client_ca: Path | None = None  # PEM: mutual TLS, the CA clients' certificates chain to

    def check(self) -> ServerTls:
        """Load every file once, so a missing or mismatched one stops start-up with its
        reason (ValueError) instead of failing the first handshake."""
        try:
            self.context()
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"TLS files {self.cert}, {self.key}: {e}") from None
        return self

    def pems(self) -> tuple[bytes, bytes, bytes | None]:
        """(key, certificate chain, client CA or None) as PEM bytes."""
        ca = self.client_ca.read_bytes() if self.client_ca is not None else None
        return self.key.read_bytes(), self.cert.read_bytes(), ca

    def context(self) -> ssl.SSLContext:
        """A server-side context (TLS 1.2 and later) for asyncio listeners."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            ctx.load_verify_locations(cafile=self.client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def client_context(
    ca: Path | None, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    """A client-side context trusting ``ca`` (None: the system's roots), showing ``cert`` and
    ``key`` for mutual TLS when given."""
    ctx = ssl.create_default_context(cafile=ca)
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


@dataclass(frozen=True)
class ClientTls:
    """How this process's clients of the cluster's other processes (storage nodes, forwarders)
    connect: trusting ``ca`` and, for listeners that ask (mutual TLS), showing ``cert``."""

    ca: Path | None  # PEM; None: the system's roots
    cert: Path | None = None
    key: Path | None = None

    def context(self) -> ssl.SSLContext:
        return client_context(self.ca, self.cert, self.key)

    def pems(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(CA, key, certificate chain) as PEM bytes, None where not set."""
        return (
            self.ca.read_bytes() if self.ca is not None else None,
            self.key.read_bytes() if self.key is not None else None,
            self.cert.read_bytes() if self.cert is not None else None,
        )


class InternalClients:
    """The process's one setting for its internal clients: None is plaintext (the default).
    Set once at start-up by the composition root (``configure``), before any channel opens,
    like ``storage.cache_budget.PROCESS``: every internal channel and append connection of
    the process is secured the same way, so it is a process setting, not a per-call one."""

    def __init__(self) -> None:
        self.tls: ClientTls | None = None

    def configure(self, tls: ClientTls | None) -> None:
        if tls is not None:
            try:
                tls.context()  # a missing or bad file stops start-up here
            except (OSError, ssl.SSLError) as e:
                raise ValueError(f"TLS files of the internal clients: {e}") from None
        self.tls = tls


INTERNAL = InternalClients()
ZOOKEEPER = InternalClients()  # the process's ZooKeeper sessions (TLS to secureClientPort)
