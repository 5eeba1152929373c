"""grpcio's TLS credentials from the process's TLS files (``core/tls.py``): the server's, and
the channel credentials its own clients use to reach a TLS port of the cluster."""

from __future__ import annotations

from pathlib import Path

import grpc

from pubsubd.core.tls import ServerTls

__all__ = ["channel_credentials", "server_credentials"]


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """The certificate and key; with a client CA, clients must show a certificate it signed."""
    key, cert, ca = tls.pems()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def channel_credentials(
    ca: Path | None, cert: Path | None = None, key: Path | None = None
) -> grpc.ChannelCredentials:
    """Credentials trusting ``ca`` (None: the system's roots), showing ``cert`` and ``key`` to a
    server that asks for a client certificate (mutual TLS)."""
    return grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes() if ca is not None else None,
        private_key=key.read_bytes() if key is not None else None,
        certificate_chain=cert.read_bytes() if cert is not None else None,
    )
