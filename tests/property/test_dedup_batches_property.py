"""Property test: whatever bytes a PublishDeduplicated request holds, the flat reading
(core/dedup_batches.py) either declines it or reads exactly what the full parse reads, and
stores the same bytes."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubd._gen.pubsubd.v1 import replay_pb2 as r
from pubsubd.core.dedup_batches import MessageBatch, flat_request

pytestmark = pytest.mark.property

texts = st.text(st.sampled_from("ab:0é\x00"), max_size=4)
messages = st.builds(
    r.DeduplicatedMessage,
    dedup_id=texts,
    data=st.binary(max_size=3),
    attributes=st.one_of(st.just({}), st.dictionaries(texts, texts, max_size=1)),
    ordering_key=st.one_of(st.just(""), texts),
)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    req = r.PublishDeduplicatedRequest(topic=draw(st.sampled_from(["", "projects/p/topics/t"])))
    req.messages.extend(draw(st.lists(messages, max_size=4)))
    if draw(st.booleans()):
        req.source = draw(st.integers(min_value=-2, max_value=3))
    raw = req.SerializeToString()
    # Sometimes damage or extend the canonical bytes.
    cut = draw(st.integers(min_value=0, max_value=len(raw)))
    return draw(st.sampled_from([raw, raw[:cut] + draw(st.binary(max_size=3)) + raw[cut:]]))


def _check(raw: bytes) -> None:
    flat = flat_request(raw)
    if flat is None:
        return
    req = r.PublishDeduplicatedRequest.FromString(raw)  # the flat form parses
    assert req.messages and all(m.dedup_id and m.data for m in req.messages)
    assert not any(m.attributes or m.ordering_key for m in req.messages)
    assert flat.topic == req.topic
    assert flat.source == (req.source if req.HasField("source") else None)
    general = MessageBatch([(m.dedup_id, m) for m in req.messages])
    assert list(flat.batch.dedup_ids) == list(general.dedup_ids)
    every = list(range(len(req.messages)))
    assert flat.batch.stored(every) == general.stored(every)
    assert flat.batch.stored(every[1:]) == general.stored(every[1:])


@settings(max_examples=500, deadline=None)
@given(requests())
def test_flat_reading_of_requests(raw: bytes) -> None:
    _check(raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_flat_reading_of_any_bytes(raw: bytes) -> None:
    try:
        _check(raw)
    except DecodeError:
        pytest.fail("the flat reading took bytes the full parse rejects")
