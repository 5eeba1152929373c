"""Partial responses: the ``fields`` system parameter of Google's REST APIs (pure).

``fields`` names the parts of the response to keep, in Google's field-selector syntax:
comma-separated paths, ``/`` for a sub-field (``subscriptions/name``), parentheses for several
sub-fields of one field (``receivedMessages(ackId,message/data)``) and ``*`` for every field
of a message. A repeated field selects in each of its elements. Names are the JSON names
(lowerCamelCase); the proto names (snake_case) are accepted too, as Google does. A name the
response message does not have is refused (400, ``Invalid field selection NAME``), checked
against the response's descriptor (fields at their default are left out of the JSON, so
absence proves nothing).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

__all__ = ["FieldSelectionError", "Selection", "apply", "parse"]

# A selection: field JSON name -> the selection inside it (None: the whole field).
Selection = dict[str, "Selection | None"]

MAX_SELECTOR_CHARS = 8192


class FieldSelectionError(ValueError):
    """The ``fields`` parameter cannot be parsed, or names a field the response lacks."""


def parse(selector: str, descriptor: Descriptor) -> Selection:
    """The selection ``selector`` makes in a response of type ``descriptor``."""
    if len(selector) > MAX_SELECTOR_CHARS:
        raise FieldSelectionError(f"Invalid field selection: longer than {MAX_SELECTOR_CHARS}")
    parser = _Parser(selector.replace(" ", ""))
    selection = parser.selections(descriptor)
    if parser.at != len(parser.text):
        raise FieldSelectionError(f"Invalid field selection {selector}")
    return selection


def apply(value: Any, selection: Selection) -> Any:
    """``value`` (a JSON document) with only the selected fields."""
    if isinstance(value, list):
        return [apply(item, selection) for item in value]
    if not isinstance(value, dict):
        return value
    if "*" in selection:
        inner = selection["*"]
        return {k: v if inner is None else apply(v, inner) for k, v in value.items()}
    kept: dict[str, Any] = {}
    for name, inner in selection.items():
        if name in value:
            kept[name] = value[name] if inner is None else apply(value[name], inner)
    return kept


class _Parser:
    """Recursive descent over ``path ("," path)*`` where ``path = name ("/" path |
    "(" selections ")")?``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def selections(self, descriptor: Descriptor | None) -> Selection:
        selection: Selection = {}
        while True:
            self._path(descriptor, selection)
            if self._peek() != ",":
                return selection
            self.at += 1

    def _path(self, descriptor: Descriptor | None, into: Selection) -> None:
        name = self._name()
        key, child, nested = _resolve(name, descriptor)
        following = self._peek()
        if following not in ("/", "("):
            into[key] = None
            return
        if not nested:
            raise FieldSelectionError(f"Invalid field selection {name}: not a message")
        self.at += 1
        inner: Selection = {}
        if following == "(":
            inner = self.selections(child)
            if self._peek() != ")":
                raise FieldSelectionError(f"Invalid field selection: ')' expected at {self.at}")
            self.at += 1
        else:
            self._path(child, inner)
        _merge(into, {key: inner})

    def _name(self) -> str:
        start = self.at
        while self.at < len(self.text) and (
            self.text[self.at].isalnum() or self.text[self.at] in "_*"
        ):
            self.at += 1
        if start == self.at:
            raise FieldSelectionError(f"Invalid field selection: a name expected at {start}")
        return self.text[start : self.at]

    def _peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""


def _merge(into: Selection, more: Selection) -> None:
    """Add ``more`` to ``into``; a field selected whole stays whole."""
    for key, inner in more.items():
        if key not in into:
            into[key] = inner
        elif into[key] is None or inner is None:
            into[key] = None
        else:
            existing = into[key]
            assert existing is not None
            _merge(existing, inner)


def _resolve(name: str, descriptor: Descriptor | None) -> tuple[str, Descriptor | None, bool]:
    """The JSON key for ``name`` in ``descriptor``, the message type inside it (None for a
    scalar or a map: a map's keys are any names) and whether it has fields to select."""
    if name == "*":
        return "*", None, True
    if descriptor is None:  # inside a map: any key
        return name, None, False
    field = descriptor.fields_by_name.get(name) or next(
        (f for f in descriptor.fields if f.json_name == name), None
    )
    if field is None:
        raise FieldSelectionError(f"Invalid field selection {name}")
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        return field.json_name, None, False
    if field.message_type.GetOptions().map_entry:
        return field.json_name, None, True
    return field.json_name, field.message_type, True
