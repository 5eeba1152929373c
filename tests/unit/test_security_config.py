"""``config.with_security`` (TLS files and authentication settings checked at load) and the
certificates of ``pubsubd certs dev`` (core/tls.py, cli/security.py)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509

from pubsubd.cli.security import write_dev_certs
from pubsubd.config import ServerConfig, with_security
from pubsubd.core.tls import ClientTls, InternalClients, ServerTls

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    write_dev_certs(directory)
    return directory


def test_dev_certificates_chain_to_the_dev_ca_with_the_loopback_names(certs: Path) -> None:
    server = x509.load_pem_x509_certificate((certs / "server.pem").read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert {str(a) for a in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    tls = ServerTls(certs / "server.pem", certs / "server-key.pem", certs / "ca.pem").check()
    assert tls.context().verify_mode == ssl.CERT_REQUIRED
    ClientTls(certs / "ca.pem", certs / "client.pem", certs / "client-key.pem").context()
    assert (certs / "server-key.pem").stat().st_mode & 0o077 == 0  # the user's only


def test_with_security_turns_tls_and_authentication_on(certs: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 40 + b"\n")
    cfg = with_security(
        ServerConfig(),
        tls_cert=certs / "server.pem",
        tls_key=certs / "server-key.pem",
        auth_secret_file=secret,
        auth_audience="pubsubd",
    )
    assert cfg.tls is not None and cfg.tls.client_ca is None
    assert cfg.tokens is not None and cfg.tokens.secret == b"x" * 40  # the newline stripped
    assert cfg.tokens.audience == "pubsubd"
    assert ServerConfig().tls is None and ServerConfig().tokens is None  # off by default


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"tls_cert": Path("server.pem")}, "both --tls-cert and --tls-key"),
        ({"tls_cert": Path("/nonexistent.pem"), "tls_key": Path("/x.pem")}, "TLS files"),
        ({"auth_audience": "a"}, "need a secret or a public key"),
        ({"auth_secret_file": Path("/nonexistent-secret")}, "authentication"),
    ],
)
def test_with_security_names_what_is_wrong(kwargs: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        with_security(ServerConfig(), **kwargs)  # type: ignore[arg-type]


def test_internal_clients_refuse_a_missing_ca(tmp_path: Path) -> None:
    internal = InternalClients()
    with pytest.raises(ValueError, match="internal clients"):
        internal.configure(ClientTls(tmp_path / "missing.pem"))
    assert internal.tls is None
