"""Spark options of the ``pubsubd`` format, parsed once on the driver into picklable settings.

Spark hands options over as a ``CaseInsensitiveDict``; copying it with ``dict(...)`` lower-cases
the keys, so every lookup here goes through :func:`_get` on the original mapping. Option names
follow the Kafka source where they mean the same.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pubsubd.core.client_security import ClientSecurity
from pubsubd.spark.client import EndpointError, resolve_endpoint

# Rows per replay Read call. Each call costs ~0.5 ms of server CPU whatever its size (gRPC), so
# pages of 5000 spend 0.1 µs per row on it; the server caps a page at 10,000 rows and 16 MB.
DEFAULT_FETCH_SIZE = 5000


class OptionError(ValueError):
    """An invalid or missing option of the pubsubd data source."""


def _get(options: Mapping[str, Any], name: str) -> str | None:
    value = options.get(name)
    if value is None:  # a plain dict (tests, direct use): match case-insensitively
        lowered = name.lower()
        for key, v in options.items():
            if key.lower() == lowered:
                value = v
                break
    return None if value is None else str(value)


def _int(options: Mapping[str, Any], name: str, minimum: int = 1) -> int | None:
    text = _get(options, name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError as exc:
        raise OptionError(f"option {name} must be an integer, got {text!r}") from exc
    if value < minimum:
        raise OptionError(f"option {name} must be >= {minimum}, got {value}")
    return value


def _bool(options: Mapping[str, Any], name: str, default: bool) -> bool:
    text = _get(options, name)
    if text is None:
        return default
    if text.strip().lower() in ("true", "1", "yes"):
        return True
    if text.strip().lower() in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name} must be true or false, got {text!r}")


def parse_timestamp(text: str, name: str) -> int:
    """Epoch milliseconds (Kafka's form) or an ISO-8601 time -> epoch microseconds."""
    value = text.strip()
    if value.lstrip("-").isdigit():
        return int(value) * 1000
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise OptionError(
            f"option {name} must be epoch milliseconds or ISO-8601, got {text!r}"
        ) from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = when - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def parse_endpoint(options: Mapping[str, Any]) -> str:
    """The ``endpoint`` option as a gRPC target: ``host:port``, or several servers (a cluster's
    frontends) as ``ipv4:A,B`` or ``A,B``; default ``PUBSUB_EMULATOR_HOST``, else
    127.0.0.1:8085."""
    try:
        return resolve_endpoint(_get(options, "endpoint"))
    except EndpointError as e:
        raise OptionError(str(e)) from None


def topic_path(options: Mapping[str, Any]) -> str:
    """The ``topic`` option as ``projects/{project}/topics/{id}`` (a short id takes the ``project``
    option, else ``PUBSUB_PROJECT_ID`` / ``GOOGLE_CLOUD_PROJECT``)."""
    topic = _get(options, "topic")
    if not topic:
        raise OptionError("option topic is required (projects/{project}/topics/{topic} or an id)")
    if topic.startswith("projects/"):
        return topic
    project = (
        _get(options, "project")
        or os.environ.get("PUBSUB_PROJECT_ID")
        or os.environ.get("GOOGLE_CLOUD_PROJECT")
    )
    if not project:
        raise OptionError(f"option topic {topic!r} is a short id: also set option project")
    return f"projects/{project}/topics/{topic}"


@dataclass(frozen=True)
class SourceOptions:
    """Everything the readers need; picklable, so it travels to executors inside partitions."""

    endpoint: str
    topic: str
    subscription: str | None
    starting_offsets: str | None
    ending_offsets: str | None
    starting_timestamp: int | None  # epoch microseconds
    ending_timestamp: int | None
    max_offsets_per_trigger: int | None
    max_bytes_per_trigger: int | None
    min_partitions: int | None
    max_offsets_per_partition: int | None
    fail_on_data_loss: bool
    fetch_size: int
    security: ClientSecurity

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> SourceOptions:
        start_ts = _get(options, "startingTimestamp")
        end_ts = _get(options, "endingTimestamp")
        return cls(
            endpoint=parse_endpoint(options),
            topic=topic_path(options),
            subscription=_get(options, "subscription") or None,
            starting_offsets=_get(options, "startingOffsets"),
            ending_offsets=_get(options, "endingOffsets"),
            starting_timestamp=parse_timestamp(start_ts, "startingTimestamp") if start_ts else None,
            ending_timestamp=parse_timestamp(end_ts, "endingTimestamp") if end_ts else None,
            max_offsets_per_trigger=_int(options, "maxOffsetsPerTrigger"),
            max_bytes_per_trigger=_int(options, "maxBytesPerTrigger"),
            min_partitions=_int(options, "minPartitions"),
            max_offsets_per_partition=_int(options, "maxOffsetsPerPartition"),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            fetch_size=_int(options, "fetchSize") or DEFAULT_FETCH_SIZE,
            security=client_security(options),
        )


@dataclass(frozen=True)
class SinkOptions:
    """Settings of the sink; ``write_id`` names one batch write (part of its dedup IDs)."""

    endpoint: str
    topic: str
    batch_size: int
    write_id: str
    security: ClientSecurity

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> SinkOptions:
        return cls(
            endpoint=parse_endpoint(options),
            topic=topic_path(options),
            batch_size=min(1000, _int(options, "publishBatchSize") or 1000),
            write_id=_get(options, "writeId") or uuid.uuid4().hex,
            security=client_security(options),
        )


def client_security(options: Mapping[str, Any]) -> ClientSecurity:
    """TLS (``caFile``: a PEM CA, at this path on the driver and every executor) and a bearer
    token (``token``, or ``tokenFile``: read on every call) for the server's calls; the
    ``PUBSUBD_CA_FILE`` / ``PUBSUBD_TOKEN`` / ``PUBSUBD_TOKEN_FILE`` environment of the
    driver when no option is given."""
    ca, token, token_file = (_get(options, k) for k in ("caFile", "token", "tokenFile"))
    try:
        if ca is None and token is None and token_file is None:
            return ClientSecurity.from_env()
        return ClientSecurity(
            ca_file=Path(ca) if ca else None,
            token=token or None,
            token_file=Path(token_file) if token_file else None,
        )
    except ValueError as e:
        raise OptionError(str(e)) from None
