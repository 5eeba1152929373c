"""The JSON of the hot REST messages without ``json_format`` (pure): a PullResponse written
straight to text, a PublishRequest body of the common shape and a flat body of scalars
(Acknowledge, ModifyAckDeadline, Pull) read straight into the message.

``json_format`` walks descriptors in Python for every value: ~17 µs a pulled message to a dict
and ~12 µs more to pretty-print it, ~14 µs a published message and an ack ID from JSON
(BENCHMARKS.md, "REST v1 beside gRPC"). These produce exactly
what the general path produces (same bytes, same message; property-tested against it in
``tests/unit/test_rest_fast_json.py``) for the shapes they know, and say so by returning None
otherwise, so the general path stays the one that defines the mapping and reports errors.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

__all__ = ["flat_request_from", "publish_request_from", "pull_response_json"]

_quote = json.encoder.encode_basestring_ascii  # what json.dumps uses (ensure_ascii)
_b64encode = base64.b64encode


def pull_response_json(response: Any, pretty: bool) -> bytes:
    """``response_body(PullResponse)``: json.dumps(MessageToDict(r), indent=2) + "\\n" when
    ``pretty``, else the compact form."""
    received = response.received_messages
    if not received:
        return b"{}\n" if pretty else b"{}"
    if pretty:
        nl1, nl2, nl3, nl4, nl5 = ("\n" + "  " * i for i in range(1, 6))
        sep = ": "
    else:
        nl1 = nl2 = nl3 = nl4 = nl5 = ""
        sep = ":"
    items = []
    for rm in received:
        fields = []
        if rm.ack_id:
            fields.append(f'{nl3}"ackId"{sep}{_quote(rm.ack_id)}')
        if rm.HasField("message"):
            m = rm.message
            parts = []
            if m.data:
                parts.append(f'{nl4}"data"{sep}"{_b64encode(m.data).decode()}"')
            if m.attributes:
                pairs = ",".join(
                    f"{nl5}{_quote(k)}{sep}{_quote(v)}" for k, v in m.attributes.items()
                )
                parts.append(f'{nl4}"attributes"{sep}{{{pairs}{nl4}}}')
            if m.message_id:
                parts.append(f'{nl4}"messageId"{sep}{_quote(m.message_id)}')
            if m.HasField("publish_time"):
                parts.append(f'{nl4}"publishTime"{sep}"{m.publish_time.ToJsonString()}"')
            if m.ordering_key:
                parts.append(f'{nl4}"orderingKey"{sep}{_quote(m.ordering_key)}')
            body = f"{{{','.join(parts)}{nl3}}}" if parts else "{}"
            fields.append(f'{nl3}"message"{sep}{body}')
        if rm.delivery_attempt:
            fields.append(f'{nl3}"deliveryAttempt"{sep}{rm.delivery_attempt}')
        items.append(f"{nl2}{{{','.join(fields)}{nl2}}}" if fields else f"{nl2}{{}}")
    text = f'{{{nl1}"receivedMessages"{sep}[{",".join(items)}{nl1}]{nl1[:1]}}}'
    return (text + "\n" if pretty else text).encode()


# A message of a Publish body in its common shape: these keys, these types.
_MESSAGE_KEYS = {
    "data": "data",
    "attributes": "attributes",
    "orderingKey": "ordering_key",
    "ordering_key": "ordering_key",
}


def publish_request_from(document: Any, request: Any) -> bool:
    """Fill ``request`` (a fresh PublishRequest) from a decoded JSON body if the body has the
    common shape: ``{"messages": [{"data": base64, "attributes": {str: str}, "orderingKey":
    str}, ...]}`` (any of the keys, each once; ``topic`` comes from the path). False (request
    untouched) for anything else, which the general path then parses or refuses."""
    if not isinstance(document, dict) or set(document) - {"messages"}:
        return False
    messages = document.get("messages", [])
    if not isinstance(messages, list):
        return False
    parsed = []
    for item in messages:
        if not isinstance(item, dict):
            return False
        fields: dict[str, Any] = {}
        for key, value in item.items():
            name = _MESSAGE_KEYS.get(key)
            if name is None or name in fields:
                return False
            if name == "data":
                if not isinstance(value, str):
                    return False
                try:
                    value = base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError):
                    return False
            elif name == "attributes":
                if not isinstance(value, dict) or not all(
                    isinstance(v, str) for v in value.values()
                ):
                    return False
            elif not isinstance(value, str):
                return False
            fields[name] = value
        parsed.append(fields)
    for fields in parsed:
        request.messages.add(**fields)
    return True


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def flat_request_from(document: Any, request: Any) -> bool:
    """Fill ``request`` (a fresh message) from a decoded JSON body whose every key names a
    string, repeated string, int32 or bool field (by its JSON or proto name) with a value of
    that type: Acknowledge's 1000 ack IDs, ModifyAckDeadline, Pull. False (request untouched)
    for anything else."""
    if not isinstance(document, dict):
        return False
    fields = request.DESCRIPTOR.fields_by_name
    json_names = {fd.json_name: fd for fd in request.DESCRIPTOR.fields}
    plan = []
    seen = set()
    for key, value in document.items():
        fd = json_names.get(key) or fields.get(key)
        if fd is None or fd.name in seen or fd.message_type is not None:
            return False
        seen.add(fd.name)
        kind = fd.type
        if fd.is_repeated:
            if kind != fd.TYPE_STRING or not isinstance(value, list):
                return False
            if not all(isinstance(v, str) for v in value):
                return False
        elif kind == fd.TYPE_STRING:
            if not isinstance(value, str):
                return False
        elif kind == fd.TYPE_INT32:
            if type(value) is not int or not _INT32_MIN <= value <= _INT32_MAX:
                return False
        elif kind == fd.TYPE_BOOL:
            if not isinstance(value, bool):
                return False
        else:
            return False
        plan.append((fd, value))
    for fd, value in plan:
        if fd.is_repeated:
            getattr(request, fd.name).extend(value)
        else:
            setattr(request, fd.name, value)
    return True
