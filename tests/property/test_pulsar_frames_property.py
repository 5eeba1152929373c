"""Property: any sequence of Pulsar frames, cut into any chunks, decodes to what was encoded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubd.pulsar import frames, messages
from pubsubd.pulsar.api import MessageMetadata, SingleMessageMetadata

pytestmark = pytest.mark.property

_frame = st.one_of(
    st.tuples(st.binary(min_size=1, max_size=64), st.none(), st.just(b"")),
    st.tuples(st.binary(min_size=1, max_size=64), st.binary(max_size=64), st.binary(max_size=512)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_frame, min_size=1, max_size=8), st.lists(st.integers(1, 97), min_size=1))
def test_frames_survive_any_chunking(
    spec: list[tuple[bytes, bytes | None, bytes]], cuts: list[int]
) -> None:
    stream = b"".join(
        frames.encode_command(c) if m is None else frames.encode_payload_command(c, m, p)
        for c, m, p in spec
    )
    decoder = frames.FrameDecoder()
    got: list[frames.Frame] = []
    at = 0
    i = 0
    while at < len(stream):
        step = cuts[i % len(cuts)]
        got += decoder.feed(stream[at : at + step])
        at += step
        i += 1
    assert decoder.buffered == 0
    assert [(f.command, f.metadata, f.payload) for f in got] == [(c, m, p) for c, m, p in spec]
    assert all(
        f.checksum_ok is (None if m is None else True)
        for f, (_, m, _) in zip(got, spec, strict=True)
    )


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.binary(max_size=200),
            st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3),
            st.text(max_size=8),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_batches_split_back_into_their_messages(
    batch: list[tuple[bytes, dict[str, str], str]],
) -> None:
    entries = []
    for data, props, key in batch:
        single = SingleMessageMetadata(partition_key=key)
        for k, v in props.items():
            single.properties.add(key=k, value=v)
        entries.append((single, data))
    body = messages.pack_batch(entries)
    meta = MessageMetadata(
        producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=len(batch)
    )
    out = messages.unpack_send("p", 0, meta.SerializeToString(), body)
    assert [(m.data, m.attributes, m.ordering_key) for m in out] == batch


_single = st.fixed_dictionaries(
    {
        "data": st.binary(max_size=300),
        "sequence_id": st.none() | st.integers(0, 2**64 - 1),
        "event_time": st.sampled_from([0, 0, 0, 1_700_000_000_000]),
        "key": st.sampled_from(["", "", "", "k"]),
        "compacted": st.sampled_from([False, False, False, True]),
    }
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_single, min_size=1, max_size=12),
    st.sampled_from([0, 0, 1_900_000_000_000]),
    st.integers(0, 2**40),
    st.sampled_from([None, 0, 1, 3, 17]),
    st.binary(max_size=4),
)
def test_the_plain_batch_reader_agrees_with_the_general_one(
    batch: list[dict[str, object]],
    deliver_at: int,
    first_seq: int,
    cut: int | None,
    tail: bytes,
) -> None:
    """Any batch (plain or not, whole or cut short, with trailing bytes): the reader without
    a parse per plain message gives what the general reader gives, or the same error."""
    entries = []
    for m in batch:
        single = SingleMessageMetadata(partition_key=str(m["key"]))
        if m["sequence_id"] is not None:
            single.sequence_id = int(m["sequence_id"])  # type: ignore[call-overload]
        if m["event_time"]:
            single.event_time = int(m["event_time"])  # type: ignore[call-overload]
        if m["compacted"]:
            single.compacted_out = True
        entries.append((single, bytes(m["data"])))  # type: ignore[arg-type]
    body = messages.pack_batch(entries)
    if cut is not None:
        body = body[: len(body) - cut]
    body += tail
    meta = MessageMetadata(
        producer_name="p", sequence_id=first_seq, publish_time=1, num_messages_in_batch=len(batch)
    )
    if deliver_at:
        meta.deliver_at_time = deliver_at

    def read(fast: bool) -> object:
        try:
            out = messages.unpack_send(
                "p", 0, meta.SerializeToString(), body, "x/", plain_fast=fast
            )
        except messages.BadPayload as e:
            return ("error", str(e))
        return [(m.data, m.attributes, m.ordering_key, m.dedup_id) for m in out]

    assert read(True) == read(False)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.tuples(st.binary(max_size=40), st.integers(0, 2**35)), min_size=1, max_size=5),
    st.data(),
)
def test_a_plain_batch_with_a_byte_changed_reads_alike(
    batch: list[tuple[bytes, int]], data: st.DataObject
) -> None:
    """A plain batch with one byte changed, inserted or removed anywhere: both readers give the
    same messages, or the same error."""
    body = bytearray(
        messages.pack_batch([(SingleMessageMetadata(sequence_id=s), d) for d, s in batch])
    )
    at = data.draw(st.integers(0, len(body) - 1))
    how = data.draw(st.sampled_from(["set", "insert", "remove"]))
    if how == "remove":
        del body[at]
    else:
        value = data.draw(st.sampled_from([0x00, 0x01, 0x18, 0x40, 0x7F, 0x80, 0xFF]))
        if how == "set":
            body[at] = value
        else:
            body.insert(at, value)
    meta = MessageMetadata(
        producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=len(batch)
    ).SerializeToString()

    def read(fast: bool) -> object:
        try:
            out = messages.unpack_send("p", 0, meta, bytes(body), plain_fast=fast)
        except messages.BadPayload as e:
            return ("error", str(e))
        return [(m.data, m.attributes, m.ordering_key, m.dedup_id) for m in out]

    assert read(True) == read(False)
