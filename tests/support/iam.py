"""Official clients that call as a given principal, the way the test-only
``--trust-caller-header`` server option believes it (``x-pubsubd-caller`` on every call)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.schema_service import SchemaServiceClient
from google.pubsub_v1.services.schema_service.transports import SchemaServiceGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

CALLER_HEADER = "x-pubsubd-caller"


class _Header(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    def __init__(self, member: str) -> None:
        self.member = member

    def _details(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), (CALLER_HEADER, self.member)]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Any):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: Any, requests: Any
    ):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), requests)


def channel_as(endpoint: str, member: str | None) -> grpc.Channel:
    channel = grpc.insecure_channel(endpoint)
    return grpc.intercept_channel(channel, _Header(member)) if member else channel


def publisher_as(endpoint: str, member: str | None, **kwargs: Any) -> pubsub_v1.PublisherClient:
    """A publisher calling as ``member`` (None: no header, the anonymous caller)."""
    transport = PublisherGrpcTransport(channel=channel_as(endpoint, member))
    return pubsub_v1.PublisherClient(transport=transport, **kwargs)


def subscriber_as(endpoint: str, member: str | None) -> pubsub_v1.SubscriberClient:
    return pubsub_v1.SubscriberClient(
        transport=SubscriberGrpcTransport(channel=channel_as(endpoint, member))
    )


def schemas_as(endpoint: str, member: str | None) -> SchemaServiceClient:
    return SchemaServiceClient(
        transport=SchemaServiceGrpcTransport(channel=channel_as(endpoint, member))
    )
