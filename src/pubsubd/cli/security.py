"""``pubsubd certs dev DIR`` (a local CA, a server and a client certificate to try TLS) and
``pubsubd tokens create`` (a JWT for a subject, for operators).

The certificates are for trying TLS on one machine: the server's names are 127.0.0.1, ::1 and
localhost, the keys are unencrypted and readable only by the user (0600). A production
deployment uses certificates from its own CA.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import time
from pathlib import Path
from typing import Annotated

import typer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pubsubd.core.tokens import create_token

certs_app = typer.Typer(no_args_is_help=True, help="Certificates for trying TLS locally.")
tokens_app = typer.Typer(no_args_is_help=True, help="Bearer tokens (JWT) for authentication.")

# What `certs dev` writes: file name -> what it is.
CA_CERT = "ca.pem"  # the local CA: trust it in clients (--tls-ca, ssl_channel_credentials)
CA_KEY = "ca-key.pem"
SERVER_CERT = "server.pem"  # --tls-cert
SERVER_KEY = "server-key.pem"  # --tls-key
CLIENT_CERT = "client.pem"  # a client certificate for mutual TLS (--tls-client-ca ca.pem)
CLIENT_KEY = "client-key.pem"
DEV_VALIDITY = dt.timedelta(days=365)
SERVER_NAMES = ("localhost",)
SERVER_ADDRESSES = ("127.0.0.1", "::1")


def write_dev_certs(directory: Path, *, now: dt.datetime | None = None) -> dict[str, Path]:
    """A CA, a server certificate it signed (SANs: localhost, 127.0.0.1, ::1) and a client
    certificate it signed, written under ``directory``; the files by name."""
    now = now or dt.datetime.now(dt.UTC)
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pubsubd dev CA")])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    written = {CA_CERT: _write_cert(directory / CA_CERT, ca)}
    written[CA_KEY] = _write_key(directory / CA_KEY, ca_key)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in SERVER_NAMES]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in SERVER_ADDRESSES]
    # The server certificate is also a client one: in a cluster each process shows its own
    # certificate to the others' mutually authenticated ports.
    server_usage = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    for cert_file, key_file, common_name, usage, names in (
        (SERVER_CERT, SERVER_KEY, "localhost", server_usage, sans),
        (CLIENT_CERT, CLIENT_KEY, "pubsubd dev client", [ExtendedKeyUsageOID.CLIENT_AUTH], []),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        builder = (
            _builder(subject, ca_name, key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        written[cert_file] = _write_cert(
            directory / cert_file, builder.sign(ca_key, hashes.SHA256())
        )
        written[key_file] = _write_key(directory / key_file, key)
    return written


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePublicKey, now: dt.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + DEV_VALIDITY)
    )


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


@certs_app.command("dev")
def certs_dev(
    directory: Annotated[Path, typer.Argument(help="where to write the PEM files")],
) -> None:
    """A local CA, a server certificate (localhost, 127.0.0.1, ::1) and a client certificate,
    for trying TLS and mutual TLS on one machine. Not for production."""
    for name, path in write_dev_certs(directory).items():
        typer.echo(f"{name}\t{path}")
    typer.echo(
        f"serve with: pubsubd serve --tls-cert {directory / SERVER_CERT} "
        f"--tls-key {directory / SERVER_KEY} [--tls-client-ca {directory / CA_CERT}]"
    )


@tokens_app.command("create")
def tokens_create(
    subject: Annotated[str, typer.Option(help="who the token names: alice@example.com, ...")],
    secret_file: Annotated[
        Path | None, typer.Option(help="HS256: the secret file the server checks with")
    ] = None,
    private_key: Annotated[
        Path | None, typer.Option(help="RS256: the PEM private key of the server's public key")
    ] = None,
    expires_in: Annotated[
        float | None, typer.Option(help="seconds until it expires (default: never)")
    ] = None,
    audience: Annotated[str | None, typer.Option(help="the aud claim")] = None,
    issuer: Annotated[str | None, typer.Option(help="the iss claim")] = None,
) -> None:
    """Print a JWT for ``--subject`` signed with ``--secret-file`` (HS256) or
    ``--private-key`` (RS256)."""
    if (secret_file is None) == (private_key is None):
        raise typer.BadParameter("give exactly one of --secret-file and --private-key")
    if expires_in is not None and not expires_in > 0:
        raise typer.BadParameter("--expires-in must be a positive number of seconds")
    token = create_token(
        subject,
        secret=secret_file.read_bytes().strip() if secret_file is not None else None,
        private_key=private_key.read_bytes() if private_key is not None else None,
        expires_in_s=expires_in,
        audience=audience,
        issuer=issuer,
        now=time.time(),
    )
    typer.echo(token)
