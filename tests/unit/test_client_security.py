"""The client tools' TLS and token settings (core/client_security.py) and the Spark connector's
``caFile`` / ``token`` / ``tokenFile`` options: bad settings fail with their name, and a
token file is read again on every call (a replaced token is picked up)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from pubsubd.core.client_security import ClientSecurity
from pubsubd.spark.options import OptionError, SinkOptions, client_security

pytestmark = pytest.mark.unit


def test_token_file_is_read_on_every_call(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    security = ClientSecurity(token_file=path)
    assert security.metadata() == [("authorization", "Bearer first")]
    path.write_text("second")
    assert security.metadata() == [("authorization", "Bearer second")]
    assert ClientSecurity().metadata() == []


def test_bad_settings_are_refused_with_their_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not both"):
        ClientSecurity(token="t", token_file=tmp_path / "t")
    with pytest.raises(ValueError, match=r"missing\.pem"):
        ClientSecurity(ca_file=tmp_path / "missing.pem")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        ClientSecurity(token_file=tmp_path / "empty")


def test_spark_options_carry_tls_and_token_to_executors(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    options = {"topic": "projects/p/topics/t", "CAFILE": str(ca), "token": "secret-token"}
    parsed = SinkOptions.parse(options)
    assert parsed.security == ClientSecurity(ca_file=ca, token="secret-token")
    assert pickle.loads(pickle.dumps(parsed)).security == parsed.security
    with pytest.raises(OptionError, match="nowhere"):
        client_security({"caFile": str(tmp_path / "nowhere")})
    assert client_security({}) == ClientSecurity.from_env()
