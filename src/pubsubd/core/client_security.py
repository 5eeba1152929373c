"""How pubsubd's own client tools reach a server with TLS and a bearer token: the ``pubsubd``
CLI's client commands, the prober (``pubsubd prober`` and the in-server one) and the Spark
connector.

``ClientSecurity(ca_file, token, token_file)``: with ``ca_file`` the channel speaks TLS and
trusts that CA (PEM); with ``token`` (or ``token_file``, read again on every call, so a token
an operator replaces is picked up) every call carries ``authorization: Bearer T``. A token
without TLS goes as plain metadata (a development set-up: ``serve --auth-*`` without
``--tls-*``), through a client interceptor, since gRPC sends call credentials only over TLS.
Neither set: plaintext without a token, as the official clients talk to the emulator.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

__all__ = ["ClientSecurity"]

# Environment variables the client tools read when their flags are not given.
CA_FILE_ENV = "PUBSUBD_CA_FILE"
TOKEN_ENV = "PUBSUBD_TOKEN"
TOKEN_FILE_ENV = "PUBSUBD_TOKEN_FILE"


@dataclass(frozen=True)
class ClientSecurity:
    ca_file: Path | None = None
    token: str | None = None
    token_file: Path | None = None

    def __post_init__(self) -> None:
        if self.token and self.token_file is not None:
            raise ValueError("give a token or a token file, not both")
        if self.ca_file is not None and not self.ca_file.is_file():
            raise ValueError(f"CA file {self.ca_file} is not a readable file")
        if self.token_file is not None:
            self.current_token()  # a missing or empty file fails here, with its name

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ClientSecurity:
        env = os.environ if environ is None else environ
        ca, token_file = env.get(CA_FILE_ENV), env.get(TOKEN_FILE_ENV)
        return cls(
            ca_file=Path(ca) if ca else None,
            token=env.get(TOKEN_ENV) or None,
            token_file=Path(token_file) if token_file else None,
        )

    @property
    def has_token(self) -> bool:
        return bool(self.token) or self.token_file is not None

    def current_token(self) -> str:
        """The token calls carry now ('' without one)."""
        if self.token_file is None:
            return self.token or ""
        try:
            token = self.token_file.read_text().strip()
        except OSError as e:
            raise ValueError(f"token file: {e}") from None
        if not token:
            raise ValueError(f"token file {self.token_file} is empty")
        return token

    def metadata(self) -> list[tuple[str, str]]:
        """The call metadata carrying the token (empty without one)."""
        return [("authorization", f"Bearer {self.current_token()}")] if self.has_token else []

    def channel(self, target: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A blocking channel to ``target`` with this TLS and token."""
        if self.ca_file is None:
            channel = grpc.insecure_channel(target, list(options))
            if not self.has_token:
                return channel
            return grpc.intercept_channel(channel, _TokenInterceptor(self))
        credentials = grpc.ssl_channel_credentials(root_certificates=self.ca_file.read_bytes())
        if self.has_token:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.metadata_call_credentials(_TokenPlugin(self))
            )
        return grpc.secure_channel(target, credentials, list(options))


class _TokenPlugin(grpc.AuthMetadataPlugin):  # type: ignore[misc]
    def __init__(self, security: ClientSecurity) -> None:
        self.security = security

    def __call__(self, context: Any, callback: Any) -> None:
        try:
            callback(tuple(self.security.metadata()), None)
        except ValueError as e:
            callback((), e)


class _TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """Adds the token to every call of a plaintext channel."""

    def __init__(self, security: ClientSecurity) -> None:
        self.security = security

    def _with_token(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), *self.security.metadata()]
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)


class _CallDetails(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(
        self,
        method: str,
        timeout: float | None,
        metadata: Any,
        credentials: Any,
        wait_for_ready: bool | None,
        compression: Any,
    ) -> None:
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression
