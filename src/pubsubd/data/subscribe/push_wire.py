"""What a push subscription sends, and the pure policies that pace it (no I/O, no clock reads).

Request formats (docs/GOOGLE_API.md §7.11; Google's "push subscriptions" and "payload
unwrapping" pages):

* ``pubsub_wrapper`` (the default): a JSON body
  ``{"message": {"data": base64, "attributes": {...}, "messageId", "message_id", "publishTime",
  "publish_time", "orderingKey"?}, "subscription": name, "deliveryAttempt"?}``. Both spellings of
  the ID and the time are sent, as Google does. ``deliveryAttempt`` only with a dead-letter policy.
* ``no_wrapper``: the raw message data as the body. With ``write_metadata`` the metadata goes in
  headers: ``x-goog-pubsub-subscription-name``, ``x-goog-pubsub-message-id``,
  ``x-goog-pubsub-publish-time``, ``x-goog-pubsub-ordering-key`` (when set), and every attribute
  as a header of its own name. Attributes that cannot be an HTTP/1.1 header (name not a token,
  control characters in the value) or that would change the framing (``content-length``, ...)
  are left out.

HTTP 102/200/201/202/204 acknowledges; anything else, a transport error or a timeout is a failure.

Pacing: ``AimdWindow`` limits concurrent pushes (slow start, then additive increase; halved on
failure, at most once per window of sends), ``backoff_s`` is the exponential hold of a failed
message and the pause of a failing subscription.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

ACK_STATUS = frozenset({102, 200, 201, 202, 204})

# Hold of a failed message (when the subscription has no retry policy; with one, the dispatcher
# applies the policy to the nack), and the subscription's pause while pushes keep failing.
DEFAULT_MIN_BACKOFF_S = 0.1
DEFAULT_MAX_BACKOFF_S = 60.0

_TOKEN = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# Headers an attribute must not set: they frame the request or belong to the transport.
_RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "proxy-authorization",
        "proxy-connection",
    }
)


# --- request bodies ---------------------------------------------------------------------------


def publish_time(message: Any) -> str:
    """RFC 3339 UTC ("Zulu") with 0, 3, 6 or 9 fractional digits, as protobuf JSON writes it."""
    return str(message.publish_time.ToJsonString())


def wrapped_body(message: Any, subscription: str, delivery_attempt: int = 0) -> bytes:
    """The default push body: the JSON wrapper around a ``PubsubMessage``."""
    when = publish_time(message)
    msg: dict[str, Any] = {"data": base64.b64encode(message.data).decode("ascii")}
    if message.attributes:
        msg["attributes"] = dict(sorted(message.attributes.items()))
    msg["messageId"] = message.message_id
    msg["message_id"] = message.message_id
    msg["publishTime"] = when
    msg["publish_time"] = when
    if message.ordering_key:
        msg["orderingKey"] = message.ordering_key
    body: dict[str, Any] = {"message": msg, "subscription": subscription}
    if delivery_attempt:
        body["deliveryAttempt"] = delivery_attempt
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def metadata_headers(message: Any, subscription: str) -> list[tuple[bytes, bytes]]:
    """Headers of an unwrapped push with ``write_metadata``: metadata, then the attributes."""
    headers = [
        (b"x-goog-pubsub-subscription-name", subscription.encode()),
        (b"x-goog-pubsub-message-id", message.message_id.encode()),
        (b"x-goog-pubsub-publish-time", publish_time(message).encode()),
    ]
    if message.ordering_key and (value := header_value(message.ordering_key)) is not None:
        headers.append((b"x-goog-pubsub-ordering-key", value))
    taken = {name for name, _ in headers}
    for key, raw in sorted(message.attributes.items()):
        name = key.lower()
        if not _TOKEN.fullmatch(name) or name in _RESERVED_HEADERS:
            continue
        value = header_value(raw)
        bname = name.encode()
        if value is None or bname in taken:
            continue
        taken.add(bname)
        headers.append((bname, value))
    return headers


def header_value(text: str) -> bytes | None:
    """``text`` as an HTTP/1.1 field value (UTF-8, outer blanks trimmed); None if impossible."""
    if _CONTROL.search(text):
        return None
    return text.strip(" \t").encode()


def request(
    push_config: Any, subscription: str, message: Any, delivery_attempt: int = 0
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """(body, headers) of the POST that pushes ``message`` under ``push_config``."""
    if push_config.HasField("no_wrapper"):
        headers: list[tuple[bytes, bytes]] = []
        if push_config.no_wrapper.write_metadata:
            headers = metadata_headers(message, subscription)
        if not any(name == b"content-type" for name, _ in headers):
            headers.append((b"content-type", b"application/octet-stream"))
        return bytes(message.data), headers
    body = wrapped_body(message, subscription, delivery_attempt)
    return body, [(b"content-type", b"application/json")]


def acknowledges(status: int) -> bool:
    return status in ACK_STATUS


# --- pacing -----------------------------------------------------------------------------------


def backoff_s(failures: int, minimum: float, maximum: float) -> float:
    """Delay after the ``failures``-th consecutive failure: minimum * 2^(failures-1), capped."""
    if failures <= 0:
        return 0.0
    maximum = max(maximum, minimum)
    if minimum <= 0:
        return 0.0
    # 2**63 overflows nothing in Python but there is no point computing it.
    exponent = min(failures - 1, 62)
    return float(min(maximum, minimum * (1 << exponent)))


class AimdWindow:
    """How many pushes may be outstanding at once: additive increase, multiplicative decrease.

    Every push is numbered when it starts (``start``) and reported when it ends (``end``). A
    success grows the window by one while it is below ``threshold`` (slow start: doubling per
    round trip) and by 1/window above it (one per round trip). A failure halves the window (not
    below ``minimum``), but only once per window of sends: failures of pushes that started before
    the last decrease are the same congestion event and change nothing.
    """

    def __init__(self, initial: int = 4, minimum: int = 1, maximum: int = 1000) -> None:
        if not 1 <= minimum <= initial <= maximum:
            raise ValueError("need 1 <= minimum <= initial <= maximum")
        self.minimum = minimum
        self.maximum = maximum
        self._size = float(initial)
        self.threshold = float(maximum)
        self.in_flight = 0
        self._next_seq = 0
        self._recover_seq = -1  # sends numbered <= this belong to the last decrease

    @property
    def size(self) -> int:
        return int(self._size)

    def available(self) -> int:
        """Pushes that may start now."""
        return max(0, self.size - self.in_flight)

    def start(self) -> int:
        """A push starts; returns its sequence number for ``end``."""
        self.in_flight += 1
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def end(self, seq: int, ok: bool) -> None:
        """The push numbered ``seq`` ended, acknowledged or not."""
        self.in_flight = max(0, self.in_flight - 1)
        if ok:
            if self._size < self.threshold:
                self._size += 1.0
            else:
                self._size += 1.0 / self._size
            self._size = min(self._size, float(self.maximum))
        elif seq > self._recover_seq:
            self._size = max(float(self.minimum), self._size / 2.0)
            self.threshold = max(float(self.minimum), self._size)
            self._recover_seq = self._next_seq - 1

    def cancel(self, seq: int) -> None:
        """The push was abandoned (no verdict): free its slot only."""
        self.in_flight = max(0, self.in_flight - 1)
