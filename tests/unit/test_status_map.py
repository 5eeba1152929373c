"""Unit tests for pubsubd.api.grpc.status.to_status: domain errors -> gRPC/HTTP status."""

from __future__ import annotations

import inspect

import grpc
import pytest

from pubsubd.api.grpc.status import to_status
from pubsubd.core import errors
from pubsubd.core.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InternalError,
    InvalidAckId,
    InvalidArgument,
    InvalidResourceName,
    NotFound,
    OutOfRange,
    PermissionDenied,
    PubsubError,
    ResourceExhausted,
    SubscriptionNotFound,
    TopicNotFound,
    Unavailable,
)

pytestmark = pytest.mark.unit

C = grpc.StatusCode

# The codes google.pubsub_v1's Publisher transport retries Publish on (default retry predicate).
PUBLISH_RETRY_CODES = frozenset(
    {
        C.ABORTED,
        C.CANCELLED,
        C.DEADLINE_EXCEEDED,
        C.INTERNAL,
        C.RESOURCE_EXHAUSTED,
        C.UNAVAILABLE,
        C.UNKNOWN,
    }
)

ERROR_CLASSES = sorted(
    (
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, PubsubError)
        and cls is not PubsubError
        and cls.__module__ == errors.__name__
    ),
    key=lambda c: c.__name__,
)


def bare(cls: type[PubsubError]) -> PubsubError:
    """An instance without calling __init__ (constructors differ; to_status looks at the type)."""
    return cls.__new__(cls)


def test_error_classes_found() -> None:
    assert {
        InvalidArgument,
        OutOfRange,
        InvalidResourceName,
        InvalidAckId,
        NotFound,
        TopicNotFound,
        SubscriptionNotFound,
        AlreadyExists,
        FailedPrecondition,
        ResourceExhausted,
        Unavailable,
        InternalError,
    } <= set(ERROR_CLASSES)


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_only_internal_error_maps_to_internal(cls: type[PubsubError]) -> None:
    code, http = to_status(bare(cls))
    if cls is InternalError:
        assert (code, http) == (C.INTERNAL, 500)
    else:
        assert code not in (C.INTERNAL, C.UNKNOWN, C.OK)
        assert 400 <= http < 600


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_permanent_errors_are_not_retried_by_clients(cls: type[PubsubError]) -> None:
    code, _ = to_status(bare(cls))
    if cls is InternalError:
        return
    if cls.retriable:
        assert code in PUBLISH_RETRY_CODES
    else:
        assert code not in PUBLISH_RETRY_CODES


@pytest.mark.parametrize(
    ("exc", "code", "http"),
    [
        (InvalidArgument("x"), C.INVALID_ARGUMENT, 400),
        (OutOfRange("x"), C.OUT_OF_RANGE, 400),
        (InvalidResourceName("topics", "projects/p/topics/1"), C.INVALID_ARGUMENT, 400),
        (InvalidAckId("junk"), C.INVALID_ARGUMENT, 400),
        (NotFound("snapshot", "projects/p/snapshots/s"), C.NOT_FOUND, 404),
        (TopicNotFound("projects/p/topics/t"), C.NOT_FOUND, 404),
        (SubscriptionNotFound("projects/p/subscriptions/s"), C.NOT_FOUND, 404),
        (AlreadyExists("topic", "projects/p/topics/t"), C.ALREADY_EXISTS, 409),
        (
            PermissionDenied("pubsub.topics.get", "projects/p/topics/t", "allUsers"),
            C.PERMISSION_DENIED,
            403,
        ),
        (Aborted("etag"), C.ABORTED, 409),
        (FailedPrecondition("detached"), C.FAILED_PRECONDITION, 400),
        (ResourceExhausted("quota"), C.RESOURCE_EXHAUSTED, 429),
        (Unavailable("shutting down"), C.UNAVAILABLE, 503),
        (InternalError("disk"), C.INTERNAL, 500),
    ],
)
def test_specific_codes(exc: PubsubError, code: grpc.StatusCode, http: int) -> None:
    assert to_status(exc) == (code, http)


def test_subclass_defined_elsewhere_uses_nearest_mapped_base() -> None:
    class MyNotFound(TopicNotFound):
        pass

    class Weird(PubsubError):
        pass

    assert to_status(MyNotFound("projects/p/topics/t"))[0] == C.NOT_FOUND
    assert to_status(Weird("x"))[0] == C.INTERNAL


@pytest.mark.parametrize(
    "exc", [RuntimeError("boom"), KeyError("k"), ValueError(), Exception(), KeyboardInterrupt()]
)
def test_unknown_exception_is_internal(exc: BaseException) -> None:
    assert to_status(exc) == (C.INTERNAL, 500)


def test_messages_name_the_resource() -> None:
    assert "projects/p/topics/t" in str(TopicNotFound("projects/p/topics/t"))
    assert "projects/p/subscriptions/s" in str(
        AlreadyExists("subscription", "projects/p/subscriptions/s")
    )
    assert "junk" in str(InvalidAckId("junk"))
