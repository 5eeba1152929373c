"""The Pulsar front's publishes made in this process (pulsar/gateway.py, ``publish_in_process``).

``Gateway.publish`` hands the request's bytes to ``ReplayServicer.publish_in_process``, the
PublishDeduplicated method's own work, instead of making the RPC. Over a real node: messages are
stored with their IDs, a repeated dedup ID is stored once and answered with its original ID, a
partition's producer stores in its source, errors come back as the Pulsar errors the RPC's
status would give (errors.py), a bug as UnknownError, a publish whose caller gave up is stored
once all the same, and a view carrying a caller's token never skips the RPC.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pubsubd._gen.pubsubd.v1 import replay_pb2
from pubsubd.api.grpc.replay import ReplayServicer
from pubsubd.core import ids, pb
from pubsubd.core.dedup_batches import flat_request
from pubsubd.node import Node
from pubsubd.observability import sli
from pubsubd.pulsar.errors import PulsarError
from pubsubd.pulsar.gateway import Gateway, publish_request
from pubsubd.pulsar.messages import OutMessage
from tests.support.inproc import running_node

pytestmark = pytest.mark.unit

TOPIC = "projects/proj/topics/top"
SPREAD = "projects/proj/topics/spread"
# Never dialled: every publish below is made in process (a call through the channel would fail
# UNAVAILABLE, which no assertion below accepts).
NOWHERE = "127.0.0.1:9"


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    async with running_node(tmp_path) as n:
        n.catalog.create_topic(pb.Topic(name=TOPIC))
        n.catalog.create_topic(pb.Topic(name=SPREAD, labels={"pubsubd-publish-sources": "3"}))
        yield n


@pytest.fixture
async def gateway(node: Node) -> AsyncIterator[Gateway]:
    servicer = ReplayServicer(node.catalog, node.routes, node.cursors, node.snapshots, node.clock)
    gw = Gateway(NOWHERE, servicer.publish_in_process)
    yield gw
    await gw.close()


def _message(n: int, data: bytes = b"payload") -> object:
    return OutMessage(data, {"k": "v"} if n % 2 else {}, "", f"pulsar/inc/producer/{n}")


def _stored(node: Node, topic: str, source: int) -> list[object]:
    uid = node.catalog.topic(topic).record.uid
    publishing = node.routes.publishing(uid)
    entries = publishing.read(uid, source, 0, 100, 1 << 20)
    return [m for e in entries for m in pb.PublishRequest.FromString(e.payload).messages]


async def test_messages_are_stored_in_order_with_their_ids(node: Node, gateway: Gateway) -> None:
    first = await gateway.publish(TOPIC, [_message(0, b"a"), _message(1, b"b")])
    second = await gateway.publish(TOPIC, [_message(2, b"c")])
    assert first == ["0", "1"] and second == ["2"]
    stored = _stored(node, TOPIC, 0)
    assert [m.data for m in stored] == [b"a", b"b", b"c"]  # type: ignore[attr-defined]
    assert stored[1].attributes["k"] == "v"  # type: ignore[attr-defined]


async def test_a_repeated_dedup_id_is_stored_once_with_its_first_id(
    node: Node, gateway: Gateway
) -> None:
    assert await gateway.publish(TOPIC, [_message(7, b"x")]) == ["0"]
    assert await gateway.publish(TOPIC, [_message(8, b"y")]) == ["1"]
    assert await gateway.publish(TOPIC, [_message(7, b"x"), _message(9, b"z")]) == ["0", "2"]
    assert [m.data for m in _stored(node, TOPIC, 0)] == [b"x", b"y", b"z"]  # type: ignore[attr-defined]


async def test_a_partition_producer_stores_in_its_source(node: Node, gateway: Gateway) -> None:
    found = await gateway.publish(SPREAD, [_message(0, b"p2")], source=2)
    assert found == [str(ids.position(2, 0))]
    assert [m.data for m in _stored(node, SPREAD, 2)] == [b"p2"]  # type: ignore[attr-defined]
    assert _stored(node, SPREAD, 0) == [] and _stored(node, SPREAD, 1) == []


@pytest.mark.parametrize(
    ("topic", "messages", "source", "error", "text"),
    [
        ("projects/proj/topics/missing", [_message(0)], None, "TopicNotFound", "NOT_FOUND"),
        (TOPIC, [_message(0)], 5, "NotAllowedError", "source"),
        (TOPIC, [OutMessage(b"d", {}, "", "")], None, "NotAllowedError", "dedup_id"),
        (TOPIC, [OutMessage(b"", {}, "", "pulsar/x/y/1")], None, "NotAllowedError", "INVALID"),
    ],
)
async def test_errors_are_the_pulsar_errors_of_the_rpcs_status(
    gateway: Gateway,
    topic: str,
    messages: list[object],
    source: int | None,
    error: str,
    text: str,
) -> None:
    with pytest.raises(PulsarError) as raised:
        await gateway.publish(topic, messages, source)
    assert raised.value.error == error
    assert text in raised.value.message


async def test_a_bug_is_logged_and_answered_unknown_error(
    gateway: Gateway, node: Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(self: ReplayServicer, raw: bytes) -> tuple[list[str], int]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(ReplayServicer, "publish_deduplicated", broken)
    recorded: list[tuple[str, str]] = []
    monkeypatch.setattr(sli, "record_rpc", lambda m, c, s, t=None: recorded.append((m, c)))
    with (
        caplog.at_level(logging.ERROR, logger="pubsubd.api.grpc.status"),
        pytest.raises(PulsarError) as raised,
    ):
        await gateway.publish(TOPIC, [_message(0)])
    assert raised.value.error == "UnknownError"
    assert "INTERNAL" in raised.value.message
    assert "PublishDeduplicated failed" in caplog.text
    assert recorded == [("PublishDeduplicated", "INTERNAL")]


async def test_publishes_are_counted_as_the_method(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded: list[tuple[str, str]] = []
    monkeypatch.setattr(sli, "record_rpc", lambda m, c, s, t=None: recorded.append((m, c)))
    await gateway.publish(TOPIC, [_message(0)])
    with pytest.raises(PulsarError):
        await gateway.publish(TOPIC, [_message(1)], source=9)
    assert recorded == [("PublishDeduplicated", "OK"), ("PublishDeduplicated", "INVALID_ARGUMENT")]


async def test_a_publish_whose_caller_gave_up_is_stored_once(node: Node, gateway: Gateway) -> None:
    call = asyncio.ensure_future(gateway.publish(TOPIC, [_message(3, b"once")]))
    for _ in range(3):
        await asyncio.sleep(0)  # the append is under way
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # The client sends it again after a reconnect: the original ID, nothing stored twice.
    assert await gateway.publish(TOPIC, [_message(3, b"once")]) == ["0"]
    assert [m.data for m in _stored(node, TOPIC, 0)] == [b"once"]  # type: ignore[attr-defined]


async def test_a_callers_view_always_makes_the_rpc(gateway: Gateway) -> None:
    view = gateway.as_caller("token")
    assert view.publish_in_process is None
    assert gateway.publish_in_process is not None


@pytest.mark.parametrize("source", [None, 0, 2])
def test_plain_messages_are_encoded_as_protobuf_would(source: int | None) -> None:
    """A request of plain messages is spliced together (the flat form the server reads without
    a message object each): the same bytes protobuf writes; any other goes through protobuf."""
    plain = [OutMessage(b"d" * n, {}, "", f"pulsar/i/p/{n}") for n in (1, 5, 200, 1)]
    expected = replay_pb2.PublishDeduplicatedRequest(
        topic=TOPIC,
        messages=[replay_pb2.DeduplicatedMessage(dedup_id=m.dedup_id, data=m.data) for m in plain],
    )
    if source is not None:
        expected.source = source
    assert publish_request(TOPIC, plain, source) == expected.SerializeToString()
    assert flat_request(publish_request(TOPIC, plain, source)) is not None
    keyed = [*plain, OutMessage(b"k", {"a": "b"}, "key", "pulsar/i/p/9")]
    parsed = replay_pb2.PublishDeduplicatedRequest.FromString(publish_request(TOPIC, keyed, source))
    assert [(m.dedup_id, m.data, dict(m.attributes), m.ordering_key) for m in parsed.messages] == [
        (m.dedup_id, m.data, m.attributes, m.ordering_key) for m in keyed
    ]
    assert parsed.HasField("source") == (source is not None)
