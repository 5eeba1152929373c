"""Checks of API requests against Google's documented limits; each failure names the field.

Limits come from docs/GOOGLE_API.md §4-§5. The checks work on raw protobuf messages and raise
domain errors (InvalidArgument, OutOfRange); the API layer maps them to status codes.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from google.protobuf.message import DecodeError

from pubsubd.core import delays, filters, flat_views, names
from pubsubd.core.delays import DELIVER_AFTER, DELIVER_AT
from pubsubd.core.errors import InvalidArgument, OutOfRange

MAX_MESSAGES_PER_PUBLISH = 1000
# Google counts the request's size; the Python client enforces the same 10,000,000 bytes.
MAX_PUBLISH_REQUEST_BYTES = 10_000_000
MAX_MESSAGE_BYTES = 10_000_000
MAX_ATTRIBUTES = 100
MAX_ATTRIBUTE_KEY_BYTES = 256
MAX_ATTRIBUTE_VALUE_BYTES = 1024
MAX_ORDERING_KEY_BYTES = 1024
MIN_ACK_DEADLINE_S = 10
MAX_ACK_DEADLINE_S = 600
DEFAULT_ACK_DEADLINE_S = 10
MAX_MODIFY_DEADLINE_S = 600
MIN_RETENTION_S = 600  # 10 minutes
MAX_RETENTION_S = 31 * 24 * 3600  # 31 days
DEFAULT_SUBSCRIPTION_RETENTION_S = 7 * 24 * 3600
MIN_EXPIRATION_TTL_S = 24 * 3600
MIN_DELIVERY_ATTEMPTS, MAX_DELIVERY_ATTEMPTS = 5, 100
MAX_BACKOFF_S = 600
MAX_LABELS = 64
MAX_FILTER_BYTES = 256
# Reserved attribute carrying a PublishDeduplicated message's dedup ID inside the stored batch
# (data/publish/dedup.py); removed before delivery and refused in client attributes.
DEDUP_ID_ATTRIBUTE = "pubsubd.dedup_id"
MAX_DEDUP_ID_BYTES = 256


def publish_request(
    request: Any, request_size: int, raw: bytes | None = None, *, now_s: float
) -> None:
    """Validate a PublishRequest (its topic name was checked by the caller).

    ``raw``: the request's wire bytes, when the caller has them; they let the attributes be
    checked on flat views of the wire (core/flat_views.py) instead of map by map. ``now_s``:
    the time a delayed-delivery attribute is checked against (epoch seconds)."""
    n = len(request.messages)
    if n == 0:
        raise InvalidArgument("messages: a PublishRequest must contain at least one message")
    if n > MAX_MESSAGES_PER_PUBLISH:
        raise InvalidArgument(
            f"messages: {n} messages in one PublishRequest; the maximum is "
            f"{MAX_MESSAGES_PER_PUBLISH}"
        )
    if request_size > MAX_PUBLISH_REQUEST_BYTES:
        raise InvalidArgument(
            f"request_size is too large: {request_size} bytes; the maximum is "
            f"{MAX_PUBLISH_REQUEST_BYTES}"
        )
    ordering_key = request.messages[0].ordering_key
    if ordering_key and len(ordering_key.encode()) > MAX_ORDERING_KEY_BYTES:
        raise InvalidArgument(
            f"messages[0].ordering_key: longer than {MAX_ORDERING_KEY_BYTES} bytes"
        )
    # Hot path: a 1000-message batch is checked once per Publish, so touch each field once.
    with_attributes = 0
    for i, m in enumerate(request.messages):
        k = len(m.attributes)
        if k:
            with_attributes += 1
            if k > MAX_ATTRIBUTES:
                raise InvalidArgument(
                    f"messages[{i}].attributes: {k} attributes; the maximum is {MAX_ATTRIBUTES}"
                )
        elif not m.data:
            raise InvalidArgument(
                f"messages[{i}]: a message must contain non-empty data or at least one attribute"
            )
        if m.ordering_key != ordering_key:
            raise InvalidArgument(
                "messages: all messages in a PublishRequest must specify the same ordering_key"
            )
    if not with_attributes:
        return
    delays_checked: set[tuple[str | None, str | None]] = set()  # a batch repeats its delays
    if raw is not None and _attributes_certainly_valid(raw):
        if delays.MARKER in raw:  # only the delay attributes' values are left to check
            for m in request.messages:
                attrs = m.attributes
                if attrs:
                    _delay_attributes(attrs, delays_checked, now_s)
        return
    for i, m in enumerate(request.messages):
        attrs = m.attributes
        if attrs:
            _attributes(i, attrs, delays_checked, now_s)
    # No message can exceed MAX_MESSAGE_BYTES: the whole request is already within that size.


_DEDUP_ID_BYTES = DEDUP_ID_ATTRIBUTE.encode()


def _attributes_certainly_valid(raw: bytes) -> bool:
    """True only if every attribute of the request passes ``_attributes`` except, perhaps, the
    values of delay attributes: the reserved attribute cannot be present (its name is absent
    from the bytes), and every key and value on the wire — a superset of those in the parsed
    maps — has a length within the limits. False means "check map by map" (which names the
    offending message), not "invalid"."""
    if _DEDUP_ID_BYTES in raw:
        return False
    try:
        keys, values = flat_views.attribute_lengths(raw)
        if len(keys) != flat_views.attribute_entries(raw):
            return False  # an entry without a key: an empty key
    except DecodeError:
        return False
    return (
        min(keys, default=1) > 0
        and max(keys, default=0) <= MAX_ATTRIBUTE_KEY_BYTES
        and max(values, default=0) <= MAX_ATTRIBUTE_VALUE_BYTES
    )


def _delay_attributes(
    attrs: Any, checked: set[tuple[str | None, str | None]], now_s: float
) -> None:
    key = (attrs.get(DELIVER_AT), attrs.get(DELIVER_AFTER))
    if key != (None, None) and key not in checked:
        delays.deliver_at(attrs, now_s)  # raises InvalidArgument naming the attribute
        checked.add(key)


def _attributes(
    i: int, attrs: Any, delays_checked: set[tuple[str | None, str | None]], now_s: float
) -> None:
    _delay_attributes(attrs, delays_checked, now_s)
    if DEDUP_ID_ATTRIBUTE in attrs:
        raise InvalidArgument(
            f"messages[{i}].attributes: {DEDUP_ID_ATTRIBUTE!r} is reserved (use the "
            "pubsubd.v1.Replay PublishDeduplicated RPC to publish with a dedup ID)"
        )
    if len(attrs) > MAX_ATTRIBUTES:
        raise InvalidArgument(
            f"messages[{i}].attributes: {len(attrs)} attributes; the maximum is {MAX_ATTRIBUTES}"
        )
    for k, v in attrs.items():
        if not k:
            raise InvalidArgument(f"messages[{i}].attributes: an attribute key is empty")
        if len(k) * 4 > MAX_ATTRIBUTE_KEY_BYTES and len(k.encode()) > MAX_ATTRIBUTE_KEY_BYTES:
            raise InvalidArgument(
                f"messages[{i}].attributes: key {k[:32]!r}... is longer than "
                f"{MAX_ATTRIBUTE_KEY_BYTES} bytes"
            )
        if len(v) * 4 > MAX_ATTRIBUTE_VALUE_BYTES and len(v.encode()) > MAX_ATTRIBUTE_VALUE_BYTES:
            raise InvalidArgument(
                f"messages[{i}].attributes[{k!r}]: value is longer than "
                f"{MAX_ATTRIBUTE_VALUE_BYTES} bytes"
            )


def duration_s(d: Any) -> float:
    return float(d.seconds) + float(d.nanos) / 1e9


def retention(field: str, d: Any) -> None:
    s = duration_s(d)
    if not MIN_RETENTION_S <= s <= MAX_RETENTION_S:
        raise InvalidArgument(
            f"{field}: {s:g}s is out of range; it must be between 10 minutes and 31 days"
        )


def labels(field: str, values: Any) -> None:
    if len(values) > MAX_LABELS:
        raise InvalidArgument(f"{field}: {len(values)} labels; the maximum is {MAX_LABELS}")
    for k, v in values.items():
        if not (1 <= len(k) <= 63) or not k[0].islower() or not k[0].isalpha():
            raise InvalidArgument(f"{field}: key {k!r} must be 1-63 chars starting with a letter")
        if not all(c.islower() or c.isdigit() or c in "_-" for c in k):
            raise InvalidArgument(f"{field}: key {k!r} may use only a-z, 0-9, _ and -")
        if len(v) > 63 or not all(c.islower() or c.isdigit() or c in "_-" for c in v):
            raise InvalidArgument(
                f"{field}: value {v!r} must be at most 63 chars of a-z, 0-9, _ and -"
            )


def topic(t: Any) -> None:
    names.topic(t.name)
    labels("labels", t.labels)
    if t.HasField("message_retention_duration"):
        retention("message_retention_duration", t.message_retention_duration)
    if t.HasField("message_storage_policy") and not (
        t.message_storage_policy.allowed_persistence_regions
    ):
        raise InvalidArgument(
            "message_storage_policy.allowed_persistence_regions: an empty list is not a valid "
            "configuration"
        )


def ack_deadline(field: str, seconds: int) -> int:
    """Return the effective ack deadline (0 means the default, 10 s)."""
    if seconds == 0:
        return DEFAULT_ACK_DEADLINE_S
    if not MIN_ACK_DEADLINE_S <= seconds <= MAX_ACK_DEADLINE_S:
        raise InvalidArgument(
            f"{field}: {seconds} is out of range; it must be between {MIN_ACK_DEADLINE_S} and "
            f"{MAX_ACK_DEADLINE_S} seconds"
        )
    return seconds


def subscription(s: Any) -> None:
    """Validate a Subscription and fill in Google's defaults in place."""
    names.subscription(s.name)
    s.ack_deadline_seconds = ack_deadline("ack_deadline_seconds", s.ack_deadline_seconds)
    labels("labels", s.labels)
    if s.HasField("message_retention_duration"):
        retention("message_retention_duration", s.message_retention_duration)
    else:
        s.message_retention_duration.seconds = DEFAULT_SUBSCRIPTION_RETENTION_S
    if s.HasField("expiration_policy") and s.expiration_policy.HasField("ttl"):
        ttl = duration_s(s.expiration_policy.ttl)
        if ttl < MIN_EXPIRATION_TTL_S:
            raise InvalidArgument(
                f"expiration_policy.ttl: {ttl:g}s is too short; the minimum is 1 day"
            )
    if s.HasField("dead_letter_policy"):
        p = s.dead_letter_policy
        if p.max_delivery_attempts == 0:
            p.max_delivery_attempts = MIN_DELIVERY_ATTEMPTS
        if not MIN_DELIVERY_ATTEMPTS <= p.max_delivery_attempts <= MAX_DELIVERY_ATTEMPTS:
            raise OutOfRange(
                f"dead_letter_policy.max_delivery_attempts: {p.max_delivery_attempts} is out of "
                f"range; it must be between {MIN_DELIVERY_ATTEMPTS} and {MAX_DELIVERY_ATTEMPTS}"
            )
        if p.dead_letter_topic:
            names.topic(p.dead_letter_topic)
    if s.HasField("retry_policy"):
        r = s.retry_policy
        for fname in ("minimum_backoff", "maximum_backoff"):
            if r.HasField(fname) and not 0 <= duration_s(getattr(r, fname)) <= MAX_BACKOFF_S:
                raise InvalidArgument(f"retry_policy.{fname}: must be between 0 and 600 seconds")
    if len(s.filter.encode()) > MAX_FILTER_BYTES:
        raise InvalidArgument(f"filter: longer than {MAX_FILTER_BYTES} bytes")
    if s.filter:
        filters.parse(s.filter)  # a syntax error names the problem and its position
    configs = [
        f for f in ("bigquery_config", "cloud_storage_config", "bigtable_config") if s.HasField(f)
    ]
    if s.push_config.push_endpoint:
        configs.append("push_config")
        push_endpoint(s.push_config.push_endpoint)
        if "x-goog-version" not in s.push_config.attributes:
            s.push_config.attributes["x-goog-version"] = "v1"
    if len(configs) > 1:
        raise InvalidArgument(f"only one delivery type may be set, got {', '.join(configs)}")


def push_endpoint(url: str) -> None:
    """A push endpoint must be an absolute http(s) URL with a host."""
    try:
        parts = urllib.parse.urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        ok = False
    if not ok or any(c.isspace() for c in url):
        raise InvalidArgument(
            f"push_config.push_endpoint: {url!r} is not an absolute http or https URL"
        )


def modify_deadline(seconds: int) -> None:
    if not 0 <= seconds <= MAX_MODIFY_DEADLINE_S:
        raise InvalidArgument(
            f"ack_deadline_seconds: {seconds} is out of range; it must be between 0 and "
            f"{MAX_MODIFY_DEADLINE_S}"
        )
