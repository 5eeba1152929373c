"""THE map from the gRPC API's status codes to Pulsar ServerError values (pure).

The front calls this process's gRPC API; whatever status it answers is reported to the Pulsar
client with the ServerError below and the status's own message, never by dropping the
connection. The C++ client retries ServiceNotReady, TooManyRequests and
ProducerBlockedQuotaExceededError, and fails the operation on the others.
"""

from __future__ import annotations

import grpc

from pubsubd.pulsar.api import ServerError

_BY_STATUS = {
    grpc.StatusCode.NOT_FOUND: "TopicNotFound",
    # The C++ client retries InvalidTopicName until its operation timeout; NotAllowedError
    # fails the call at once, with the API's message naming what is invalid.
    grpc.StatusCode.INVALID_ARGUMENT: "NotAllowedError",
    grpc.StatusCode.FAILED_PRECONDITION: "ConsumerBusy",
    grpc.StatusCode.ALREADY_EXISTS: "NotAllowedError",
    grpc.StatusCode.PERMISSION_DENIED: "AuthorizationError",
    grpc.StatusCode.UNAUTHENTICATED: "AuthenticationError",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "ProducerBlockedQuotaExceededError",
    grpc.StatusCode.UNAVAILABLE: "ServiceNotReady",
    grpc.StatusCode.DEADLINE_EXCEEDED: "ServiceNotReady",
    grpc.StatusCode.UNIMPLEMENTED: "NotAllowedError",
    grpc.StatusCode.OUT_OF_RANGE: "NotAllowedError",
    grpc.StatusCode.ABORTED: "ServiceNotReady",
    grpc.StatusCode.DATA_LOSS: "PersistenceError",
    grpc.StatusCode.INTERNAL: "UnknownError",
}


class PulsarError(Exception):
    """An error to answer a command with (its ServerError name and message)."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message

    @property
    def code(self) -> int:
        return int(ServerError.Value(self.error))


def from_status(code: grpc.StatusCode, details: str, *, subscription: bool = False) -> PulsarError:
    """The Pulsar error for a gRPC status (NOT_FOUND of a subscription is SubscriptionNotFound)."""
    error = _BY_STATUS.get(code, "UnknownError")
    if code == grpc.StatusCode.NOT_FOUND and subscription and "ubscription" in details:
        error = "SubscriptionNotFound"
    return PulsarError(error, f"{code.name}: {details}")


def from_rpc_error(e: grpc.aio.AioRpcError, *, subscription: bool = False) -> PulsarError:
    return from_status(e.code(), e.details() or "", subscription=subscription)
