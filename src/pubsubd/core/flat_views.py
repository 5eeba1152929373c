"""Flat views of a PublishRequest's wire bytes: every attribute key and value of every message
in two lists, for the validation fast path (core/validation.py), every message's data in one
list, for the replay API's columnar Read (data/decoding.py), and both at once with the topic,
for a raw stream's plain entries (``decoding._plain_entry``).

Reading attributes through the parsed ``map<string, string>`` costs ~1.25 µs per attribute in
Python (each key and value becomes a ``str``); these views cost ~0.2 µs. They rely on protobuf's
merge rule: a singular message field that occurs several times on the wire is parsed as the merge
of all occurrences, and merging concatenates repeated fields. So a request read with
``messages`` declared *singular* merges all its messages into one, and that message read with
``attributes`` declared as a singular ``{repeated bytes key = 1; repeated bytes value = 2}``
merges every map entry into one list of keys and one of values (an entry omits an empty key or
value, so a second view with ``attributes`` declared *repeated* counts the entries).

Field numbers are google.pubsub.v1's: PublishRequest.messages = 2, PubsubMessage.attributes = 2,
and a map entry's key = 1, value = 2.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "pubsubd.flat"


def _build() -> tuple[Any, Any, Any, Any]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="pubsubd/flat_views.proto", package=_PACKAGE, syntax="proto3"
    )

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = proto.message_type.add(name=name)
        for field_name, number, type_, label, type_name in fields:
            field = m.field.add(name=field_name, number=number, type=type_, label=label)
            if type_name:
                field.type_name = type_name

    one, many = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    msg = _F.TYPE_MESSAGE
    message("Entry")  # a map entry, unread: only counted
    message(
        "KeysValues",
        ("key", 1, _F.TYPE_BYTES, many, ""),
        ("value", 2, _F.TYPE_BYTES, many, ""),
    )
    message("AllEntries", ("attributes", 2, msg, many, f".{_PACKAGE}.Entry"))
    message("AllKeysValues", ("attributes", 2, msg, one, f".{_PACKAGE}.KeysValues"))
    message("EntriesView", ("messages", 2, msg, one, f".{_PACKAGE}.AllEntries"))
    message("KeysValuesView", ("messages", 2, msg, one, f".{_PACKAGE}.AllKeysValues"))
    message("AllData", ("data", 1, _F.TYPE_BYTES, many, ""))
    message("DataView", ("messages", 2, msg, one, f".{_PACKAGE}.AllData"))
    message(
        "AllDataKeysValues",
        ("data", 1, _F.TYPE_BYTES, many, ""),
        ("attributes", 2, msg, one, f".{_PACKAGE}.KeysValues"),
    )
    message(
        "DataKeysValuesView",
        ("topic", 1, _F.TYPE_BYTES, one, ""),
        ("messages", 2, msg, one, f".{_PACKAGE}.AllDataKeysValues"),
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)

    def cls(name: str) -> Any:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))

    return (
        cls("EntriesView"),
        cls("KeysValuesView"),
        cls("DataView"),
        cls("DataKeysValuesView"),
    )


_EntriesView, _KeysValuesView, _DataView, _DataKeysValuesView = _build()


def attribute_entries(raw: bytes) -> int:
    """How many attribute map entries the request's messages carry on the wire (duplicate keys
    included)."""
    return len(_EntriesView.FromString(raw).messages.attributes)


def attribute_lengths(raw: bytes) -> tuple[list[int], list[int]]:
    """The byte length of every attribute key and every value present on the wire, across all
    messages (an entry whose key or value is empty may omit it)."""
    kv = _KeysValuesView.FromString(raw).messages.attributes
    return list(map(len, kv.key)), list(map(len, kv.value))


def attribute_keys_values(raw: bytes) -> tuple[list[bytes], list[bytes]]:
    """Every attribute key and every value present on the wire, across all messages, in
    order (an entry whose key or value is empty may omit it)."""
    kv = _KeysValuesView.FromString(raw).messages.attributes
    return list(kv.key), list(kv.value)


def attribute_keys(raw: bytes) -> list[bytes]:
    """Every attribute key present on the wire, across all messages, in order."""
    return list(_KeysValuesView.FromString(raw).messages.attributes.key)


def topic_data_keys_values(raw: bytes) -> tuple[bytes, list[bytes], list[bytes], list[bytes]]:
    """The request's topic (its last ``topic`` field, empty if none), then :func:`message_data`
    and :func:`attribute_keys_values`, in one pass over the bytes."""
    view = _DataKeysValuesView.FromString(raw)
    messages = view.messages
    kv = messages.attributes
    return view.topic, list(messages.data), list(kv.key), list(kv.value)


def message_data(raw: bytes) -> list[bytes]:
    """Every ``data`` field on the wire, across all messages, in order (a message with empty
    data may omit it, one with the field repeated has several)."""
    return list(_DataView.FromString(raw).messages.data)
