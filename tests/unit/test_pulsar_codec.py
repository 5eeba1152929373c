"""The Pulsar front's pure parts: frames, batches, compression, names, message IDs, commands."""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from google.protobuf.message import DecodeError

from pubsubd.core import ids as core_ids
from pubsubd.core import pb
from pubsubd.pulsar import commands, compression, frames, ids, messages, names
from pubsubd.pulsar.api import BaseCommand, MessageMetadata, SingleMessageMetadata, Type

pytestmark = pytest.mark.unit


def _cmd(kind: str) -> BaseCommand:
    return BaseCommand(type=Type.Value(kind))


def test_simple_frame_layout() -> None:
    cmd = _cmd("PING")
    cmd.ping.SetInParent()
    raw = cmd.SerializeToString()
    data = frames.encode_command(raw)
    total, size = struct.unpack(">II", data[:8])
    assert (total, size) == (4 + len(raw), len(raw))
    (frame,) = frames.FrameDecoder().feed(data)
    assert frame.command == raw and frame.metadata is None and frame.checksum_ok is None


def test_payload_frame_checksum_is_crc32c_of_everything_after_it() -> None:
    meta = MessageMetadata(producer_name="p", sequence_id=7, publish_time=1).SerializeToString()
    data = frames.encode_payload_command(b"\x08\x06", meta, b"payload")
    at = 8 + 2
    assert struct.unpack(">H", data[at : at + 2])[0] == frames.MAGIC_CHECKSUM
    (crc,) = struct.unpack(">I", data[at + 2 : at + 6])
    assert crc == frames.crc32c(data[at + 6 :])
    # The well-known CRC32C check value: "123456789" -> 0xE3069283.
    assert frames.crc32c(b"123456789") == 0xE3069283
    (frame,) = frames.FrameDecoder().feed(data)
    assert (frame.metadata, frame.payload, frame.checksum_ok) == (meta, b"payload", True)


def test_corrupt_payload_fails_the_checksum_and_no_checksum_is_none() -> None:
    data = bytearray(frames.encode_payload_command(b"\x08\x06", b"\x0a\x01p", b"payload"))
    data[-1] ^= 0xFF
    (frame,) = frames.FrameDecoder().feed(bytes(data))
    assert frame.checksum_ok is False
    (plain,) = frames.FrameDecoder().feed(
        frames.encode_payload_command(b"\x08\x06", b"\x0a\x01p", b"x", checksum=False)
    )
    assert plain.checksum_ok is None and plain.payload == b"x"


def test_broker_entry_metadata_is_skipped() -> None:
    body = struct.pack(">I", 3) + b"cmd"
    entry = struct.pack(">HI", frames.MAGIC_BROKER_ENTRY, 2) + b"\x08\x01"
    rest = struct.pack(">I", 1) + b"m" + b"data"
    frame = frames.parse_frame(body + entry + rest)
    assert (frame.command, frame.metadata, frame.payload) == (b"cmd", b"m", b"data")


@pytest.mark.parametrize(
    "data",
    [
        struct.pack(">I", 2) + b"ab",  # no command size
        struct.pack(">II", 8, 100) + b"abcd",  # command size past the frame
        struct.pack(">II", 4, 0),  # empty command
        struct.pack(">II", 9, 1) + b"c" + struct.pack(">HH", 0x0E01, 1),  # truncated checksum
        struct.pack(">II", 11, 1) + b"c" + struct.pack(">IH", 100, 0),  # metadata past the end
    ],
)
def test_malformed_frames_raise(data: bytes) -> None:
    with pytest.raises(frames.FrameError):
        frames.FrameDecoder().feed(data)


def test_oversized_frame_is_refused_before_it_is_buffered() -> None:
    with pytest.raises(frames.FrameError, match="over the"):
        frames.FrameDecoder().feed(struct.pack(">I", frames.MAX_FRAME_SIZE + 1))


@pytest.mark.parametrize(
    "kind",
    [compression.NONE, compression.LZ4, compression.ZLIB, compression.ZSTD, compression.SNAPPY],
)
def test_every_codec_round_trips_and_checks_the_size(kind: int) -> None:
    data = b"pulsar " * 500
    packed = compression.compress(kind, data)
    assert compression.decompress(kind, packed, len(data)) == data
    if kind != compression.NONE:
        with pytest.raises(compression.CompressionError):
            compression.decompress(kind, packed, len(data) - 1)
        with pytest.raises(compression.CompressionError):
            compression.decompress(kind, b"\xff" * 16, len(data))


@pytest.mark.parametrize(
    "kind", [compression.LZ4, compression.ZLIB, compression.ZSTD, compression.SNAPPY]
)
def test_a_compression_bomb_is_refused_without_decompressing_it_whole(kind: int) -> None:
    bomb = compression.compress(kind, bytes(64 << 20))  # zstd: ~2 KB for 64 MB
    tracemalloc.start()
    try:
        with pytest.raises(compression.CompressionError, match=r"more than|buffer|says"):
            compression.decompress(kind, bomb, 1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_truncated_zlib_stream_and_a_padded_lz4_size_are_refused() -> None:
    data = b"pulsar " * 500
    with pytest.raises(compression.CompressionError, match="truncated"):
        compression.decompress(
            compression.ZLIB, compression.compress(compression.ZLIB, data)[:-4], len(data)
        )
    with pytest.raises(compression.CompressionError, match="metadata says"):
        compression.decompress(
            compression.LZ4, compression.compress(compression.LZ4, data), len(data) + 7
        )


def test_a_send_whose_text_is_not_utf8_or_time_is_out_of_range_is_a_bad_payload() -> None:
    # proto2 parsing hands a string field that is not UTF-8 over as bytes (fuzzing found it).
    meta = MessageMetadata(producer_name="p", sequence_id=1, publish_time=1)
    raw = meta.SerializeToString() + b"\x22\x08\x0a\x02\xff\xfe\x12\x02\xc3\x28"
    with pytest.raises(messages.BadPayload, match="not UTF-8"):
        messages.unpack_send("p", 1, raw, b"x")
    late = MessageMetadata(
        producer_name="p", sequence_id=1, publish_time=1, deliver_at_time=1 << 60
    )
    with pytest.raises(messages.BadPayload, match="deliver_at_time"):
        messages.unpack_send("p", 1, late.SerializeToString(), b"x")


def test_a_command_whose_topic_is_not_utf8_does_not_parse() -> None:
    lookup = _cmd("LOOKUP")
    lookup.lookupTopic.request_id = 1
    lookup.lookupTopic.topic = "persistent://public/default/tt"
    raw = lookup.SerializeToString().replace(b"persistent:/", b"persistent:\xd1")
    with pytest.raises(DecodeError, match=r"lookupTopic\.topic is not UTF-8"):
        commands.parse_command(raw)
    assert commands.parse_command(lookup.SerializeToString()) == lookup


def _batch_send(count: int, kind: int) -> tuple[bytes, bytes]:
    entries = []
    for i in range(count):
        single = SingleMessageMetadata(partition_key=f"k{i % 2}", sequence_id=10 + i)
        single.properties.add(key="i", value=str(i))
        if i == 0:
            single.event_time = 1234
        entries.append((single, f"m{i}".encode()))
    body = messages.pack_batch(entries)
    meta = MessageMetadata(
        producer_name="prod",
        sequence_id=10,
        publish_time=1,
        num_messages_in_batch=count,
        compression=kind,
        uncompressed_size=len(body),
    )
    return meta.SerializeToString(), compression.compress(kind, body)


@pytest.mark.parametrize("kind", [compression.NONE, compression.LZ4, compression.ZSTD])
def test_a_batch_unpacks_into_messages_with_attributes_keys_and_dedup_ids(kind: int) -> None:
    meta, payload = _batch_send(3, kind)
    out = messages.unpack_send("prod", 10, meta, payload)
    assert [m.data for m in out] == [b"m0", b"m1", b"m2"]
    assert [m.ordering_key for m in out] == ["k0", "k1", "k0"]
    assert [m.dedup_id for m in out] == ["pulsar/prod/10", "pulsar/prod/11", "pulsar/prod/12"]
    assert out[0].attributes == {"i": "0", messages.EVENT_TIME_ATTRIBUTE: "1234"}
    assert out[2].attributes == {"i": "2"}


def test_a_truncated_batch_is_a_bad_payload() -> None:
    meta, payload = _batch_send(3, compression.NONE)
    with pytest.raises(messages.BadPayload):
        messages.unpack_send("prod", 10, meta, payload[:-3])
    with pytest.raises(messages.BadPayload):
        messages.unpack_send("prod", 10, b"\xff\xff\xff", payload)


def test_single_message_deliver_at_becomes_the_delay_attribute() -> None:
    meta = MessageMetadata(producer_name="p", sequence_id=5, publish_time=1, deliver_at_time=1500)
    meta.properties.add(key="a", value="b")
    (out,) = messages.unpack_send("p", 5, meta.SerializeToString(), b"x")
    assert out.attributes == {"a": "b", "pubsubd.deliver_at": "1970-01-01T00:00:01.500Z"}
    assert out.dedup_id == "pulsar/p/5"


def test_message_frame_carries_attributes_key_and_event_time_back() -> None:
    msg = pb.PubsubMessage(
        data=b"d", attributes={"a": "b", messages.EVENT_TIME_ATTRIBUTE: "99"}, ordering_key="k"
    )
    msg.publish_time.seconds = 2
    (frame,) = frames.FrameDecoder().feed(messages.message_frame(3, 0, 41, 2, msg))
    cmd = BaseCommand()
    cmd.ParseFromString(frame.command)
    assert cmd.type == Type.Value("MESSAGE")
    assert (cmd.message.consumer_id, cmd.message.redelivery_count) == (3, 2)
    assert (cmd.message.message_id.ledgerId, cmd.message.message_id.entryId) == (0, 41)
    meta = MessageMetadata()
    meta.ParseFromString(frame.metadata)
    assert {kv.key: kv.value for kv in meta.properties} == {"a": "b"}
    assert (meta.partition_key, meta.event_time, meta.publish_time) == ("k", 99, 2000)
    assert frame.payload == b"d" and frame.checksum_ok is True
    assert not cmd.message.message_id.HasField("partition")
    (frame,) = frames.FrameDecoder().feed(messages.message_frame(3, 2, 41, 0, msg, partition=2))
    cmd.ParseFromString(frame.command)
    assert cmd.message.message_id.partition == 2  # a partition consumer's IDs name it


def test_batch_frame_is_the_clients_batch_format() -> None:
    plain = pb.PubsubMessage(data=b"first")
    keyed = pb.PubsubMessage(
        data=b"second", attributes={"a": "b", messages.EVENT_TIME_ATTRIBUTE: "7"}, ordering_key="k"
    )
    empty = pb.PubsubMessage()
    for m in (plain, keyed, empty):
        m.publish_time.seconds = 3
    raw = messages.batch_frame(4, 1, 90, 2, [plain, keyed, empty], partition=1)
    (frame,) = frames.FrameDecoder().feed(raw)
    cmd = BaseCommand()
    cmd.ParseFromString(frame.command)
    mid = cmd.message.message_id
    assert (cmd.message.consumer_id, cmd.message.redelivery_count) == (4, 2)
    assert (mid.ledgerId, mid.entryId, mid.partition) == (1, 90, 1)
    assert not mid.HasField("batch_index") and not cmd.message.ack_set
    meta = MessageMetadata()
    meta.ParseFromString(frame.metadata)
    assert (meta.num_messages_in_batch, meta.publish_time, meta.sequence_id) == (3, 3000, 90)
    assert frame.checksum_ok is True
    out = messages.unpack_send("p", 0, frame.metadata, frame.payload)  # the SEND reader
    assert [m.data for m in out] == [b"first", b"second", b""]
    assert out[1].attributes == {"a": "b", messages.EVENT_TIME_ATTRIBUTE: "7"}
    assert [m.ordering_key for m in out] == ["", "k", ""]
    at, singles = 0, []
    while at < len(frame.payload):
        (size,) = struct.unpack_from(">I", frame.payload, at)
        single = SingleMessageMetadata()
        single.ParseFromString(frame.payload[at + 4 : at + 4 + size])
        singles.append(single)
        at += 4 + size + single.payload_size
    assert [s.payload_size for s in singles] == [5, 6, 0]
    assert (singles[1].partition_key, singles[1].event_time) == ("k", 7)


def test_topic_names_map_both_ways() -> None:
    assert names.parse_topic("orders").google == "projects/public/topics/orders"
    t = names.parse_topic("persistent://acme/default/orders")
    assert t.google == "projects/acme/topics/orders"
    assert names.from_google(t.google).pulsar == "persistent://acme/default/orders"
    other = names.parse_topic("acme/billing/orders")
    assert other.google == "projects/acme/topics/billing.orders"
    assert names.parse_topic(names.from_google(other.google).pulsar).google == other.google
    assert t.subscription("audit") == "projects/acme/subscriptions/orders.audit"
    assert other.subscription("audit") == "projects/acme/subscriptions/billing.orders.audit"
    assert t.subscription("projects/acme/subscriptions/x") == "projects/acme/subscriptions/x"
    part = names.parse_topic("acme/default/orders-partition-3")
    assert (part.google, part.partition) == ("projects/acme/topics/orders", 3)
    assert part.pulsar == "persistent://acme/default/orders-partition-3"
    assert part.subscription("audit") == t.subscription("audit")  # one subscription, all parts
    assert names.parse_topic("orders").partition is None
    for bad in ("non-persistent://a/b/c", "persistent://a/b", "a/b/c-partition-16", "x/y/9z"):
        with pytest.raises(names.InvalidName):
            names.parse_topic(bad)


def test_message_ids_map_to_positions() -> None:
    pos = core_ids.position(2, 77)
    assert ids.from_message_id(str(pos)) == (2, 77)
    assert ids.position_of(ids.message_id_data(2, 70, 7)) == pos
    assert ids.key(ids.message_id_data(2, 70, 7)) == (2, 77)
    assert ids.position_of(ids.message_id_data(ids.EARLIEST, ids.EARLIEST)) is None
    assert ids.position_of(ids.message_id_data(ids.LATEST, ids.LATEST)) is None


def test_connected_negotiates_the_lower_protocol_version() -> None:
    for client, expected in ((21, commands.PROTOCOL_VERSION), (6, 6)):
        (frame,) = frames.FrameDecoder().feed(commands.connected(client, "pubsubd-test"))
        cmd = BaseCommand()
        cmd.ParseFromString(frame.command)
        assert cmd.connected.protocol_version == expected
        assert cmd.connected.max_message_size == frames.MAX_MESSAGE_SIZE


def test_request_id_of_any_command() -> None:
    cmd = _cmd("GET_SCHEMA")
    cmd.getSchema.request_id = 12
    assert commands.request_id_of(cmd) == 12
    flow = _cmd("FLOW")
    flow.flow.consumer_id = 1
    assert commands.request_id_of(flow) is None


def test_a_namespace_lists_each_topic_of_its_project_once() -> None:
    google = [
        "projects/acme/topics/orders",
        "projects/acme/topics/billing.invoices",
        "projects/acme/topics/billing.2x",  # not a Pulsar topic name: left out
        "projects/other/topics/orders",
    ]
    assert names.namespace_topics("acme/default", google) == ["persistent://acme/default/orders"]
    assert names.namespace_topics("acme/billing", google) == ["persistent://acme/billing/invoices"]
    for listed in names.namespace_topics("acme/billing", google):
        assert names.parse_topic(listed).google == "projects/acme/topics/billing.invoices"
    with pytest.raises(names.InvalidName):
        names.parse_namespace("acme")
