"""The security flags shared by ``serve``, ``forwarder`` and ``frontend``
(``cli/server_security.py``), the forwarder's internal token (``core/internal_token.py``) and
the cluster's auth files of ``cluster up --tokens`` (``cluster/launcher.write_cluster_auth``)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from pubsubd.cli.main import app
from pubsubd.cli.security import write_dev_certs
from pubsubd.cli.server_security import (
    NO_FLAGS,
    SecurityFlags,
    configure_zookeeper_tls,
    security_options,
)
from pubsubd.cluster.launcher import (
    ADMIN,
    ADMIN_TOKEN_FILE,
    INTERNAL,
    INTERNAL_TOKEN_FILE,
    POLICY_FILE,
    SECRET_FILE,
    write_cluster_auth,
)
from pubsubd.config import ServerConfig
from pubsubd.core.internal_token import INTERNAL_TOKEN, InternalToken
from pubsubd.core.tls import ZOOKEEPER, ClientTls
from pubsubd.core.tokens import TokenSettings, TokenVerifier, create_token

pytestmark = pytest.mark.unit

SECRET = b"s" * 40


@pytest.fixture(autouse=True)
def _no_internal_token() -> Iterator[None]:
    yield
    INTERNAL_TOKEN.configure(None)  # process settings: leave them as found
    ZOOKEEPER.configure(None)


def test_the_decorator_adds_every_flag_and_passes_them_as_one_value(tmp_path: Path) -> None:
    got: list[SecurityFlags] = []
    command = typer.Typer()

    @command.command()
    @security_options(internal_token=True)
    def run(port: int = 0, security: SecurityFlags = NO_FLAGS) -> None:
        got.append(security)
        assert port == 7

    token = tmp_path / "t"
    result = CliRunner().invoke(
        command,
        ["--port", "7", "--tls-ca", "ca.pem", "--iam", "--internal-token-file", str(token)],
    )
    assert result.exit_code == 0, result.output
    assert got == [SecurityFlags(tls_ca=Path("ca.pem"), iam=True, internal_token_file=token)]


def test_only_the_writers_take_an_internal_token() -> None:
    """Forwarders and serve write to storage nodes (which may check tokens); a frontend only
    passes its clients' tokens on."""
    group: Any = typer.main.get_command(app)

    def options(command: str) -> set[str]:
        return {o for p in group.commands[command].params for o in p.opts}

    shared = {"--tls-cert", "--tls-ca", "--auth-secret-file", "--iam", "--iam-policy-file"}
    for command in ("forwarder", "serve"):
        assert shared | {"--internal-token-file", "--zk-auth-file"} <= options(command)
    assert shared | {"--zk-auth-file"} <= options("frontend")
    assert "--internal-token-file" not in options("frontend")
    assert {"--auth-secret-file", "--zk-auth-file"} <= options("storage")
    assert "--zk-auth-file" in options("router")


def test_storage_and_router_take_the_shared_flags_they_use() -> None:
    """``storage`` and ``router`` declare their TLS (and the node its --auth-*) through
    ``security_options`` too, with only the flags they have always taken; a storage node's
    ``--internal-token-file`` names whose calls it takes."""
    group: Any = typer.main.get_command(app)

    def options(command: str) -> set[str]:
        return {o for p in group.commands[command].params for o in p.opts}

    tls = {"--tls-cert", "--tls-key", "--tls-client-ca"}
    auth = {"--auth-secret-file", "--auth-public-key", "--auth-tokens-file"}
    auth |= {"--auth-audience", "--auth-issuer"}
    iam = {"--iam", "--iam-policy-file", "--trust-caller-header"}
    assert tls | auth | {"--internal-token-file"} <= options("storage")
    assert not (iam | {"--tls-ca"}) & options("storage")
    assert tls | {"--tls-ca"} <= options("router")
    assert not (auth | iam | {"--internal-token-file"}) & options("router")


@pytest.mark.parametrize(
    "command", [["storage", "--data-dir", "d"], ["router", "--cluster", "127.0.0.1:1"]]
)
def test_storage_and_router_check_their_tls_flags(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--tls-cert", "c.pem"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "TLS needs both --tls-cert and --tls-key" in result.output


def _secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    return path


def test_a_forwarder_with_authentication_needs_a_token_it_accepts(tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["forwarder", "--cluster", "127.0.0.1:1", "--auth-secret-file", str(_secret(tmp_path))]
    missing = runner.invoke(app, base, env={"COLUMNS": "200"})
    assert missing.exit_code == 1 and "--internal-token-file" in missing.output
    foreign = tmp_path / "foreign.token"
    foreign.write_text(create_token("x", secret=b"o" * 40, now=time.time()))
    refused = runner.invoke(app, [*base, "--internal-token-file", str(foreign)])
    assert refused.exit_code == 1 and "refuses its own token" in refused.output


def test_apply_configures_the_internal_token_and_checks_it(tmp_path: Path) -> None:
    token_file = tmp_path / "internal.token"
    token = create_token("serviceAccount:peer", secret=SECRET, now=time.time())
    token_file.write_text(token + "\n")
    flags = SecurityFlags(auth_secret_file=_secret(tmp_path), internal_token_file=token_file)
    cfg = flags.apply(ServerConfig(), forwarder=True)
    assert cfg.tokens is not None and cfg.internal_token_file == token_file
    assert INTERNAL_TOKEN.metadata() == (("authorization", f"Bearer {token}"),)
    with pytest.raises(ValueError, match="cannot be used with authentication"):
        SecurityFlags(auth_secret_file=_secret(tmp_path), trust_caller_header=True).apply(
            ServerConfig()
        )


def test_internal_token_is_read_again_when_its_file_changes(tmp_path: Path) -> None:
    token = InternalToken()
    assert token.metadata() == ()
    path = tmp_path / "t"
    with pytest.raises(ValueError, match="t"):
        token.configure(path)  # missing
    path.write_text("")
    with pytest.raises(ValueError, match="empty"):
        token.configure(path)
    path.write_text("first\n")
    assert token.configure(path) == "first"
    assert token.metadata() == (("authorization", "Bearer first"),)
    path.write_text("second\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    assert token.metadata() == (("authorization", "Bearer second"),)
    path.unlink()  # unreadable: the last token read is kept
    assert token.metadata() == (("authorization", "Bearer second"),)


def test_cluster_auth_files_are_private_and_kept(tmp_path: Path) -> None:
    directory = write_cluster_auth(tmp_path / "auth")
    secret = (directory / SECRET_FILE).read_bytes().strip()
    verifier = TokenVerifier(TokenSettings(secret=secret))
    admin = (directory / ADMIN_TOKEN_FILE).read_text().strip()
    assert verifier.verify(admin).member == f"user:{ADMIN}"
    internal = (directory / INTERNAL_TOKEN_FILE).read_text().strip()
    assert verifier.verify(internal).member == INTERNAL
    policies = json.loads((directory / POLICY_FILE).read_text())
    assert policies["projects"]["*"]["bindings"][0]["members"] == [f"user:{ADMIN}"]
    for f in directory.iterdir():
        assert f.stat().st_mode & 0o077 == 0, f
    write_cluster_auth(directory)  # a cluster started again keeps its secret and tokens
    assert (directory / ADMIN_TOKEN_FILE).read_text().strip() == admin


def test_zookeeper_tls_flags_on_every_zookeeper_client(tmp_path: Path) -> None:
    group: Any = typer.main.get_command(app)
    for command in ("serve", "forwarder", "frontend", "router", "storage"):
        options = {o for p in group.commands[command].params for o in p.opts}
        assert {"--zk-tls-ca", "--zk-tls-cert", "--zk-tls-key"} <= options, command
    assert "--zk-tls-ca" in {o for p in group.commands["routing"].params for o in p.opts}
    refused = CliRunner().invoke(app, ["router", "--cluster", "x", "--zk-tls-cert", "c.pem"])
    assert refused.exit_code == 2 and "--zk-tls-ca" in refused.output
    with pytest.raises(ValueError, match="go together"):
        configure_zookeeper_tls(tmp_path / "ca.pem", tmp_path / "c.pem", None)
    with pytest.raises(ValueError):  # a CA that cannot be read stops start-up
        configure_zookeeper_tls(tmp_path / "missing.pem", None, None)
    assert ZOOKEEPER.tls is None
    write_dev_certs(tmp_path)
    configure_zookeeper_tls(
        tmp_path / "ca.pem", tmp_path / "client.pem", tmp_path / "client-key.pem"
    )
    assert ZOOKEEPER.tls == ClientTls(
        tmp_path / "ca.pem", tmp_path / "client.pem", tmp_path / "client-key.pem"
    )
