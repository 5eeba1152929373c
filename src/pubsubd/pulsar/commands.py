"""Building the broker's Pulsar commands (pure): replies, errors, receipts."""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

from pubsubd.pulsar import frames
from pubsubd.pulsar.api import BaseCommand, Type

# Protocol versions: the client sends its highest; the answer is the lower of that and ours.
# v20 is the last whose features this front either serves or the client does without.
PROTOCOL_VERSION = 20


# Commands whose text fields the front never reads (the hot ones): not checked for UTF-8.
_TEXT_UNREAD = frozenset(Type.Value(name) for name in ("SEND", "FLOW", "ACK", "PING", "PONG"))


def parse_command(raw: bytes) -> Any:
    """The BaseCommand in ``raw``; DecodeError if it does not parse, or if a text field the
    front reads is not UTF-8 (Pulsar's proto is proto2, whose Python parsing hands such a
    string over as ``bytes`` instead of refusing it)."""
    cmd = BaseCommand()
    cmd.ParseFromString(raw)
    if cmd.type not in _TEXT_UNREAD:
        path = non_utf8_field(cmd)
        if path is not None:
            raise DecodeError(f"{path} is not UTF-8")
    return cmd


def non_utf8_field(message: Any, at: str = "") -> str | None:
    """The path of the first string field of ``message`` (nested messages included) whose
    value is not UTF-8, or None."""
    for fd, value in message.ListFields():
        path = f"{at}.{fd.name}" if at else fd.name
        values = value if fd.is_repeated else (value,)
        if fd.type == FieldDescriptor.TYPE_STRING:
            if any(isinstance(v, bytes) for v in values):
                return path
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            for v in values:
                found = non_utf8_field(v, path)
                if found is not None:
                    return found
    return None


def frame(cmd: Any) -> bytes:
    return frames.encode_command(cmd.SerializeToString())


def connected(client_version: int, server_version: str) -> bytes:
    cmd = BaseCommand(type=Type.Value("CONNECTED"))
    cmd.connected.server_version = server_version
    cmd.connected.protocol_version = min(client_version, PROTOCOL_VERSION)
    cmd.connected.max_message_size = frames.MAX_MESSAGE_SIZE
    # None set: the client's auth refresh needs no broker flag (it said so in CONNECT), and no
    # broker entry metadata.
    cmd.connected.feature_flags.SetInParent()
    return frame(cmd)


# What a broker's AUTH_CHALLENGE carries to ask for fresh credentials (Pulsar's
# AuthData.REFRESH_AUTH_DATA): the client answers with its current auth data.
REFRESH_AUTH_DATA = b"PulsarAuthRefresh"


def auth_challenge(client_version: int, server_version: str, method: str) -> bytes:
    cmd = BaseCommand(type=Type.Value("AUTH_CHALLENGE"))
    cmd.authChallenge.server_version = server_version
    cmd.authChallenge.protocol_version = min(client_version, PROTOCOL_VERSION)
    cmd.authChallenge.challenge.auth_method_name = method
    cmd.authChallenge.challenge.auth_data = REFRESH_AUTH_DATA
    return frame(cmd)


def pong() -> bytes:
    cmd = BaseCommand(type=Type.Value("PONG"))
    cmd.pong.SetInParent()
    return frame(cmd)


def ping() -> bytes:
    cmd = BaseCommand(type=Type.Value("PING"))
    cmd.ping.SetInParent()
    return frame(cmd)


def success(request_id: int) -> bytes:
    cmd = BaseCommand(type=Type.Value("SUCCESS"))
    cmd.success.request_id = request_id
    return frame(cmd)


def error(request_id: int, code: int, message: str) -> bytes:
    cmd = BaseCommand(type=Type.Value("ERROR"))
    cmd.error.request_id = request_id
    cmd.error.error = code
    cmd.error.message = message
    return frame(cmd)


def partitioned_metadata(request_id: int, partitions: int) -> bytes:
    cmd = BaseCommand(type=Type.Value("PARTITIONED_METADATA_RESPONSE"))
    r = cmd.partitionMetadataResponse
    r.request_id = request_id
    r.partitions = partitions
    r.response = r.Success
    return frame(cmd)


def partitioned_metadata_error(request_id: int, code: int, message: str) -> bytes:
    cmd = BaseCommand(type=Type.Value("PARTITIONED_METADATA_RESPONSE"))
    r = cmd.partitionMetadataResponse
    r.request_id = request_id
    r.response = r.Failed
    r.error = code
    r.message = message
    return frame(cmd)


def lookup_connect(request_id: int, url: str) -> bytes:
    cmd = BaseCommand(type=Type.Value("LOOKUP_RESPONSE"))
    r = cmd.lookupTopicResponse
    r.request_id = request_id
    r.response = r.Connect
    r.brokerServiceUrl = url
    if url.startswith("pulsar+ssl://"):  # a TLS client reads this one
        r.brokerServiceUrlTls = url
    r.authoritative = True
    return frame(cmd)


def lookup_error(request_id: int, code: int, message: str) -> bytes:
    cmd = BaseCommand(type=Type.Value("LOOKUP_RESPONSE"))
    r = cmd.lookupTopicResponse
    r.request_id = request_id
    r.response = r.Failed
    r.error = code
    r.message = message
    return frame(cmd)


def producer_success(
    request_id: int,
    name: str,
    last_sequence_id: int,
    topic_epoch: int | None = None,
    ready: bool = True,
    schema_version: bytes = b"",
) -> bytes:
    """PRODUCER_SUCCESS; ``ready`` false: a WaitForExclusive producer is queued (another
    PRODUCER_SUCCESS, ready, follows when it holds the topic); ``topic_epoch``: the topic's
    exclusive-producer epoch (pulsar/access.py), which the client sends back when it
    reconnects."""
    cmd = BaseCommand(type=Type.Value("PRODUCER_SUCCESS"))
    r = cmd.producer_success
    r.request_id = request_id
    r.producer_name = name
    r.last_sequence_id = last_sequence_id
    r.producer_ready = ready
    if topic_epoch is not None:
        r.topic_epoch = topic_epoch
    if schema_version:
        r.schema_version = schema_version
    return frame(cmd)


def schema_response(
    request_id: int, name: str, schema_type: int, data: bytes, version: bytes
) -> bytes:
    """GET_SCHEMA_RESPONSE with the topic's schema (pulsar/schemas.py)."""
    cmd = BaseCommand(type=Type.Value("GET_SCHEMA_RESPONSE"))
    r = cmd.getSchemaResponse
    r.request_id = request_id
    r.schema.name = name
    r.schema.schema_data = data
    r.schema.type = schema_type
    r.schema_version = version
    return frame(cmd)


def schema_error(request_id: int, code: int, message: str) -> bytes:
    cmd = BaseCommand(type=Type.Value("GET_SCHEMA_RESPONSE"))
    r = cmd.getSchemaResponse
    r.request_id = request_id
    r.error_code = code
    r.error_message = message
    return frame(cmd)


def send_receipt(
    producer_id: int, sequence_id: int, highest_sequence_id: int, ledger: int, entry: int
) -> bytes:
    cmd = BaseCommand(type=Type.Value("SEND_RECEIPT"))
    r = cmd.send_receipt
    r.producer_id = producer_id
    r.sequence_id = sequence_id
    r.highest_sequence_id = highest_sequence_id
    r.message_id.ledgerId = ledger
    r.message_id.entryId = entry
    return frame(cmd)


def send_error(producer_id: int, sequence_id: int, code: int, message: str) -> bytes:
    cmd = BaseCommand(type=Type.Value("SEND_ERROR"))
    r = cmd.send_error
    r.producer_id = producer_id
    r.sequence_id = sequence_id
    r.error = code
    r.message = message
    return frame(cmd)


def ack_response(consumer_id: int, request_id: int) -> bytes:
    cmd = BaseCommand(type=Type.Value("ACK_RESPONSE"))
    cmd.ackResponse.consumer_id = consumer_id
    cmd.ackResponse.request_id = request_id
    return frame(cmd)


def close_consumer(consumer_id: int) -> bytes:
    """Broker-initiated: the client reconnects the consumer (looks up and subscribes again)."""
    cmd = BaseCommand(type=Type.Value("CLOSE_CONSUMER"))
    cmd.close_consumer.consumer_id = consumer_id
    cmd.close_consumer.request_id = 0
    return frame(cmd)


def active_consumer_change(consumer_id: int, active: bool) -> bytes:
    """Broker-initiated, failover: the consumer became (or stopped being) the active one of
    its topic or partition; the client calls its ConsumerEventListener."""
    cmd = BaseCommand(type=Type.Value("ACTIVE_CONSUMER_CHANGE"))
    cmd.active_consumer_change.consumer_id = consumer_id
    cmd.active_consumer_change.is_active = active
    return frame(cmd)


def close_producer(producer_id: int) -> bytes:
    cmd = BaseCommand(type=Type.Value("CLOSE_PRODUCER"))
    cmd.close_producer.producer_id = producer_id
    cmd.close_producer.request_id = 0
    return frame(cmd)


def last_message_id(request_id: int, ledger: int, entry: int, partition: int = -1) -> bytes:
    """GET_LAST_MESSAGE_ID's answer; ``partition`` >= 0 for a partition's consumer (the client
    compares it with the IDs it received, which name their partition)."""
    cmd = BaseCommand(type=Type.Value("GET_LAST_MESSAGE_ID_RESPONSE"))
    r = cmd.getLastMessageIdResponse
    r.request_id = request_id
    r.last_message_id.ledgerId = ledger
    r.last_message_id.entryId = entry
    if partition >= 0:
        r.last_message_id.partition = partition
    return frame(cmd)


def request_id_of(cmd: Any) -> int | None:
    """The request_id of any command that carries one (to answer it with an error)."""
    for field, value in cmd.ListFields():
        if field.name == "type":
            continue
        for sub, sub_value in value.ListFields():
            if sub.name == "request_id":
                return int(sub_value)
    return None


def topics_of_namespace(request_id: int, topics: list[str]) -> bytes:
    """GET_TOPICS_OF_NAMESPACE_RESPONSE: every topic of the namespace (not filtered by the
    client's pattern: the client filters)."""
    cmd = BaseCommand(type=Type.Value("GET_TOPICS_OF_NAMESPACE_RESPONSE"))
    r = cmd.getTopicsOfNamespaceResponse
    r.request_id = request_id
    r.topics.extend(topics)
    r.filtered = False
    return frame(cmd)
