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
