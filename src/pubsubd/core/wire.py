"""Hand-assembled protobuf wire bytes for the delivery hot path (pure).

Delivering a message means wrapping its stored bytes in a ReceivedMessage and a response. Doing
that with protobuf objects copies every message twice per delivery; concatenating length-delimited
fields does not, and the bytes are exactly what the protobuf library would produce. Field numbers
(google/pubsub/v1/pubsub.proto):

| message               | field                   | number | wire type        |
|-----------------------|-------------------------|--------|------------------|
| ReceivedMessage       | ack_id                  | 1      | length-delimited |
| ReceivedMessage       | message                 | 2      | length-delimited |
| ReceivedMessage       | delivery_attempt        | 3      | varint           |
| PullResponse          | received_messages       | 1      | length-delimited |
| StreamingPullResponse | received_messages       | 1      | length-delimited |
| StreamingPullResponse | subscription_properties | 4      | length-delimited |
"""

from __future__ import annotations

_ACK_ID = b"\x0a"  # field 1, length-delimited
_MESSAGE = b"\x12"  # field 2, length-delimited
_ATTEMPT = b"\x18"  # field 3, varint
_RECEIVED = b"\x0a"  # field 1, length-delimited
_PROPERTIES = b"\x22"  # field 4, length-delimited

# Varints of small lengths, precomputed: most ack IDs and many messages are short.
_SMALL = [bytes([n]) for n in range(128)]


def varint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(data: bytes, at: int, limit: int | None = None) -> tuple[int, int] | None:
    """The varint at ``data[at]`` (of at most 10 bytes, ending before ``limit``, default the
    end): (its value, the index after it); None when there is none. The value is not cut to
    64 bits as protobuf cuts it: a caller wanting protobuf's reading refuses ``>= 1 << 64``."""
    end = len(data) if limit is None else limit
    value = shift = 0
    while at < end and shift < 64:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7
    return None


def received_message(ack_id: bytes, message: bytes, delivery_attempt: int = 0) -> bytes:
    """One ``ReceivedMessage``, framed as field 1 of a (Streaming)PullResponse."""
    body = _ACK_ID + varint(len(ack_id)) + ack_id + _MESSAGE + varint(len(message)) + message
    if delivery_attempt:
        body += _ATTEMPT + varint(delivery_attempt)
    return _RECEIVED + varint(len(body)) + body


def subscription_properties(serialized: bytes) -> bytes:
    """StreamingPullResponse.subscription_properties field from its serialized message."""
    return _PROPERTIES + varint(len(serialized)) + serialized
