"""REST <-> gRPC transcoding of one call (pure): a matched rule, the query string and the JSON
body become the gRPC request message; a response message becomes JSON; an error becomes
Google's error body.

JSON is the proto3 JSON mapping (``google.protobuf.json_format``), as Google's REST API speaks
it: lowerCamelCase names (the proto names are accepted too), ``bytes`` as base64, int64 as
strings, Duration as ``"10s"``, Timestamp as RFC 3339, FieldMask as ``"a,b"`` (either name
style). Binding follows google/api/http.proto: the path variable sets its field (after the
body, so the path wins), a body of ``"*"`` is the whole request and one of a field name is
that field, and query parameters set the remaining fields (dotted paths into messages,
repeated by repeating the parameter). Google's system parameters (``alt=json``,
``prettyPrint``, ``fields``, ``key``...) are accepted; any other parameter that names no field
(or any at all when the body is the whole request) is INVALID_ARGUMENT, as Google answers.
``fields`` (partial responses) is accepted and not applied: responses are always whole.
PullResponse, PublishRequest and flat bodies (Acknowledge, ModifyAckDeadline, Pull), the hot
messages, take a faster road to the same result (``fast_json.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from pubsubd.api.rest import fields
from pubsubd.api.rest.fast_json import (
    flat_request_from,
    publish_request_from,
    pull_response_json,
)
from pubsubd.api.rest.routes import Match
from pubsubd.core import pb

__all__ = [
    "RestError",
    "build_request",
    "error_body",
    "response_body",
    "set_field",
]

# Parameters every Google API accepts beside the method's own fields.
SYSTEM_PARAMETERS = frozenset(
    {
        "$.xgafv",
        "access_token",
        "alt",
        "callback",
        "fields",
        "key",
        "oauth_token",
        "prettyPrint",
        "quotaUser",
        "upload_protocol",
        "uploadType",
        "userIp",
    }
)


_PULL_RESPONSE = pb.PullResponse.DESCRIPTOR
_PUBLISH_REQUEST = pb.PublishRequest.DESCRIPTOR

# Standard or URL-safe base64, padding optional (what Google's JSON parsers accept).
BASE64 = re.compile(r"[A-Za-z0-9+/_-]*={0,2}")


@dataclass
class RestError(Exception):
    """A call refused before it reached the service: Google's HTTP code and status name."""

    http: int
    status: str
    message: str
    details: list[dict[str, Any]] = field(default_factory=list)

    def __str__(self) -> str:
        return self.message


def invalid(message: str) -> RestError:
    return RestError(400, "INVALID_ARGUMENT", message)


def error_body(
    http: int, status: str, message: str, details: Sequence[Mapping[str, Any]] = ()
) -> bytes:
    """Google's JSON error: ``{"error": {"code", "message", "status"[, "details"]}}``."""
    error: dict[str, Any] = {"code": http, "message": message, "status": status}
    if details:
        error["details"] = list(details)
    return (json.dumps({"error": error}, indent=2) + "\n").encode()


def response_body(
    message: Any, pretty: bool = True, selection: fields.Selection | None = None
) -> bytes:
    """A response message as Google's REST API writes it (fields at their default left out),
    with only the ``selection`` of a ``fields`` parameter when there is one."""
    if message.DESCRIPTOR is _PULL_RESPONSE and selection is None:
        return pull_response_json(message, pretty)
    value = json_format.MessageToDict(message)
    if selection is not None:
        value = fields.apply(value, selection)
    if not pretty:
        return json.dumps(value, separators=(",", ":")).encode()
    return (json.dumps(value, indent=2) + "\n").encode()


def pretty(query: Mapping[str, Sequence[str]]) -> bool:
    return query.get("prettyPrint", ["true"])[-1].lower() != "false"


def build_request(found: Match, query: Mapping[str, Sequence[str]], body: bytes) -> Any:
    """The gRPC request message for a matched REST call; raises :class:`RestError`."""
    rule = found.rule
    request = rule.request()
    alt = query.get("alt", ["json"])[-1]
    if alt != "json":
        raise invalid(f"alt={alt}: only JSON is served")
    params = {k: v for k, v in query.items() if k not in SYSTEM_PARAMETERS}
    if rule.body:
        document = _parse_json(body)
        target = request if rule.body == "*" else _field_message(request, rule.body)
        if target.DESCRIPTOR is _PUBLISH_REQUEST:
            fast = publish_request_from(document, target)
        else:
            fast = flat_request_from(document, target)
        if not fast:
            _merge(document, target)
    if params:
        if rule.body == "*":
            name = next(iter(params))
            raise invalid(
                f'Invalid JSON payload received. Unknown name "{name}": Cannot bind query '
                "parameter. The request body holds every field of this method."
            )
        _merge(_query_document(request.DESCRIPTOR, params), request)
    set_field(request, found.field, found.value)
    return request


def set_field(message: Any, path: str, value: str) -> None:
    """Set the string field at a dotted ``path`` of ``message``."""
    *parents, last = path.split(".")
    for name in parents:
        message = getattr(message, name)
    setattr(message, last, value)


def _field_message(request: Any, name: str) -> Any:
    return getattr(request, name)


def _parse_json(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        document = json.loads(body)
    except UnicodeDecodeError:
        raise invalid("Invalid JSON payload received. The body is not UTF-8.") from None
    except json.JSONDecodeError as e:
        raise invalid(
            f"Invalid JSON payload received. {e.msg} at line {e.lineno} column {e.colno}."
        ) from None
    if not isinstance(document, dict):
        raise invalid("Invalid JSON payload received. The body must be a JSON object.")
    return document


def _merge(document: Mapping[str, Any], message: Any) -> None:
    _check_bytes(document, message.DESCRIPTOR, "")
    try:
        json_format.ParseDict(document, message, ignore_unknown_fields=False)
    except json_format.ParseError as e:
        text = str(e).split("\n Available Fields")[0]
        raise invalid(f"Invalid JSON payload received. {text}") from None
    except (ValueError, TypeError, OverflowError) as e:
        raise invalid(f"Invalid JSON payload received. {e}") from None


def _check_bytes(document: Any, descriptor: Descriptor, at: str) -> None:
    """Reject a ``bytes`` value that is not base64, as Google does (json_format would drop the
    characters it does not know, silently changing the data)."""
    if not isinstance(document, dict):
        return  # ParseDict reports the wrong type
    for key, value in document.items():
        fd = _field(descriptor, key)
        if fd is None:
            continue
        path = f"{at}.{key}" if at else key
        values = value if fd.is_repeated and isinstance(value, list) else [value]
        if fd.type == FieldDescriptor.TYPE_BYTES:
            for v in values:
                if isinstance(v, str) and not BASE64.fullmatch(v):
                    raise invalid(
                        f"Invalid value at '{path}' (TYPE_BYTES), Base64 decoding failed for "
                        f'"{v[:40]}"'
                    )
        elif fd.message_type is not None and not _is_wrapper_value(fd):
            if fd.message_type.GetOptions().map_entry:
                value_fd = fd.message_type.fields_by_name["value"]
                if value_fd.message_type is not None and isinstance(value, dict):
                    for k, v in value.items():
                        _check_bytes(v, value_fd.message_type, f"{path}[{k}]")
                continue
            for i, v in enumerate(values):
                _check_bytes(v, fd.message_type, f"{path}[{i}]" if fd.is_repeated else path)


def _query_document(descriptor: Descriptor, params: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Query parameters as a JSON document for ``ParseDict`` (typed per the fields)."""
    document: dict[str, Any] = {}
    for name, values in params.items():
        node, fd = document, None
        message: Descriptor | None = descriptor
        parts = name.split(".")
        for i, part in enumerate(parts):
            fd = _field(message, part) if message is not None else None
            if fd is None:
                raise invalid(
                    f'Invalid JSON payload received. Unknown name "{name}": Cannot bind query '
                    f"parameter. Field '{part}' could not be found in request message."
                )
            if i < len(parts) - 1:
                if fd.message_type is None or _is_wrapper_value(fd):
                    raise invalid(f"query parameter {name}: {part} is not a message")
                node = node.setdefault(fd.json_name, {})
                message = fd.message_type
        assert fd is not None
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            raise invalid(f"query parameter {name}: a map cannot be set from the query")
        typed = [_scalar(name, fd, v) for v in values]
        repeated = fd.is_repeated
        node[fd.json_name] = typed if repeated else typed[-1]
    return document


def _field(message: Descriptor, name: str) -> FieldDescriptor | None:
    for fd in message.fields:
        if name in (fd.name, fd.json_name):
            return fd
    return None


def _is_wrapper_value(fd: FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.full_name.startswith("google.protobuf.")


def _scalar(name: str, fd: FieldDescriptor, value: str) -> Any:
    if fd.type == FieldDescriptor.TYPE_BOOL:
        if value.lower() not in ("true", "false"):
            raise invalid(f"Invalid value at '{name}' (TYPE_BOOL), \"{value}\"")
        return value.lower() == "true"
    return value  # ParseDict parses numbers, enums and well-known types from strings
