"""A "null" Pub/Sub server: the fastest server a client can talk to, to find the client's ceiling.

It stores nothing and checks almost nothing:

* ``Publish`` parses the request only to count its messages and returns consecutive ids. If the
  topic has a subscription in *relay* mode with an open StreamingPull stream, the messages are
  handed straight to that stream (for end-to-end latency); otherwise they are dropped.
* ``StreamingPull`` on a subscription created with the label ``null-prebuilt=N`` streams N
  generated messages (``null-size`` data bytes each, default 100) as fast as the stream's
  ``max_outstanding_messages`` allows, counting acks and nacks (unary or in-stream) as releases.
  Any other subscription is in relay mode. The stream is never ended with OK.
* ``Acknowledge`` / ``ModifyAckDeadline`` only release flow control; admin RPCs echo.
* The replay API (``pubsubd.v1.Replay``, what the Spark connector calls): ``PublishDeduplicated``
  parses the request, stores nothing and answers consecutive ids (no duplicates);
  ``GetTopicRanges`` of a topic whose ID ends ``-{count}-{size}`` answers one source
  ``[0, count)``, and a columnar ``Read`` of it generates the page (``size`` data bytes per row,
  no attributes), in Arrow (pubsubd's own encoder) when the request asks and pyarrow is there;
  any other topic is empty.

Run: ``python -m bench.null_server --port 0``; it logs ``null-server ready grpc=HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import grpc

from bench import pb
from pubsubd._gen.pubsubd.v1 import replay_pb2
from pubsubd.api.grpc import replay_arrow

log = logging.getLogger("bench.null_server")

MAX_RESPONSE_MESSAGES = 1000
PREBUILT_LABEL = "null-prebuilt"
SIZE_LABEL = "null-size"
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 32 << 20),
    ("grpc.max_send_message_length", 32 << 20),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
    ("grpc.http2.max_ping_strikes", 0),
]
# grpc ships no type information; the servicer context is grpc.aio.ServicerContext.
Context: TypeAlias = Any


@dataclass
class _Subscription:
    proto: Any
    prebuilt: int = 0  # messages still to generate (prebuilt mode)
    size: int = 100
    outstanding: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)
    streams: list[asyncio.Queue[bytes]] = field(default_factory=list)
    rr: int = 0

    def release(self, count: int) -> None:
        self.outstanding = max(0, self.outstanding - count)
        self.released.set()


class NullServer:
    """State and RPC handlers of the null server (all on one event loop)."""

    def __init__(self) -> None:
        self.topics: dict[str, set[str]] = {}
        self.subscriptions: dict[str, _Subscription] = {}
        self._ids = itertools.count(1)

    # --- publisher ----------------------------------------------------------------------------

    async def create_topic(self, request: Any, context: Context) -> Any:
        self.topics.setdefault(request.name, set())
        return request

    async def get_topic(self, request: Any, context: Context) -> Any:
        return pb.Topic(name=request.topic)

    async def delete_topic(self, request: Any, context: Context) -> Any:
        self.topics.pop(request.topic, None)
        return pb.Empty()

    async def publish(self, raw: bytes, context: Context) -> bytes:
        request = pb.PublishRequest.FromString(raw)
        count = len(request.messages)
        first = next(self._ids)
        # Reserve the rest of the id range in one step.
        self._ids = itertools.count(first + count)
        ids = [str(i) for i in range(first, first + count)]
        for name in self.topics.get(request.topic, ()):
            sub = self.subscriptions.get(name)
            if sub is not None and not sub.prebuilt and sub.streams:
                self._relay(sub, request.messages, ids)
        return bytes(pb.PublishResponse(message_ids=ids).SerializeToString())

    @staticmethod
    def _relay(sub: _Subscription, messages: Any, ids: list[str]) -> None:
        seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
        response = pb.StreamingPullResponse()
        for message, mid in zip(messages, ids, strict=True):
            received = response.received_messages.add(ack_id=f"r{mid}")
            received.message.CopyFrom(message)
            received.message.message_id = mid
            received.message.publish_time.seconds = seconds
            received.message.publish_time.nanos = nanos
        sub.rr = (sub.rr + 1) % len(sub.streams)
        sub.streams[sub.rr].put_nowait(bytes(response.SerializeToString()))

    # --- subscriber ---------------------------------------------------------------------------

    async def create_subscription(self, request: Any, context: Context) -> Any:
        sub = _Subscription(request)
        sub.prebuilt = int(request.labels.get(PREBUILT_LABEL, "0"))
        sub.size = int(request.labels.get(SIZE_LABEL, "100"))
        self.subscriptions[request.name] = sub
        self.topics.setdefault(request.topic, set()).add(request.name)
        if not request.ack_deadline_seconds:
            request.ack_deadline_seconds = 10
        return request

    async def get_subscription(self, request: Any, context: Context) -> Any:
        sub = self.subscriptions.get(request.subscription)
        if sub is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "Subscription does not exist")
            raise AssertionError("abort() raises")
        return sub.proto

    async def delete_subscription(self, request: Any, context: Context) -> Any:
        sub = self.subscriptions.pop(request.subscription, None)
        if sub is not None:
            self.topics.get(sub.proto.topic, set()).discard(request.subscription)
        return pb.Empty()

    async def acknowledge(self, request: Any, context: Context) -> Any:
        sub = self.subscriptions.get(request.subscription)
        if sub is not None:
            sub.release(len(request.ack_ids))
        return pb.Empty()

    async def modify_ack_deadline(self, request: Any, context: Context) -> Any:
        sub = self.subscriptions.get(request.subscription)
        if sub is not None and request.ack_deadline_seconds == 0:
            sub.release(len(request.ack_ids))  # a nack: nothing is redelivered here
        return pb.Empty()

    async def streaming_pull(
        self, requests: AsyncIterator[Any], context: Context
    ) -> AsyncIterator[bytes]:
        first = await anext(requests)
        sub = self.subscriptions.get(first.subscription)
        if sub is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "Subscription does not exist")
            return
        reader = asyncio.create_task(self._read_stream(requests, sub))
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        try:
            if sub.prebuilt:
                async for response in self._generate(sub, first.max_outstanding_messages):
                    yield response
            else:
                sub.streams.append(queue)
                while True:
                    yield await queue.get()
            # Never end a stream with OK (the official client treats it as fatal): idle instead.
            await asyncio.Event().wait()
        finally:
            reader.cancel()
            with contextlib.suppress(ValueError):
                sub.streams.remove(queue)

    @staticmethod
    async def _read_stream(requests: AsyncIterator[Any], sub: _Subscription) -> None:
        with contextlib.suppress(Exception):
            async for request in requests:
                released = len(request.ack_ids) + sum(
                    1 for s in request.modify_deadline_seconds if s == 0
                )
                if released:
                    sub.release(released)

    async def _generate(self, sub: _Subscription, max_outstanding: int) -> AsyncIterator[bytes]:
        data = b"x" * sub.size
        while sub.prebuilt > 0:
            count = min(MAX_RESPONSE_MESSAGES, sub.prebuilt)
            if max_outstanding > 0:
                count = min(count, max_outstanding - sub.outstanding)
                if count <= 0:
                    sub.released.clear()
                    await sub.released.wait()
                    continue
            first = next(self._ids)
            self._ids = itertools.count(first + count)
            seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
            response = pb.StreamingPullResponse()
            for i in range(first, first + count):
                received = response.received_messages.add(ack_id=f"n{i}")
                message = received.message
                message.data = data
                message.message_id = str(i)
                message.publish_time.seconds = seconds
                message.publish_time.nanos = nanos
            sub.prebuilt -= count
            sub.outstanding += count
            yield bytes(response.SerializeToString())

    # --- replay API (the Spark connector) ---------------------------------------------------

    async def publish_deduplicated(self, request: Any, context: Context) -> Any:
        first = next(self._ids)
        n = len(request.messages)
        self._ids = itertools.count(first + n)
        return replay_pb2.PublishDeduplicatedResponse(
            message_ids=list(map(str, range(first, first + n)))
        )

    async def get_topic_ranges(self, request: Any, context: Context) -> Any:
        out = replay_pb2.GetTopicRangesResponse()
        count, _ = _generated(request.topic)
        if count:
            out.sources.add(source=0, earliest_offset=0, latest_offset=count)
        return out

    async def read(self, request: Any, context: Context) -> Any:
        count, size = _generated(request.topic)
        end = min(request.end_offset or count, count)
        stop = min(end, request.start_offset + min(request.max_messages or 1000, 10_000))
        out = replay_pb2.ReadResponse(next_offset=max(stop, request.start_offset))
        n = stop - request.start_offset
        if request.arrow and replay_arrow.AVAILABLE:  # encoded as pubsubd encodes a page
            ipc = replay_arrow.batch_ipc(_arrow_page(request.start_offset, n, size))
            return replay_arrow.read_response(out.next_offset, ipc)
        elif n > 0:
            cols = out.columns
            cols.offsets.extend(range(request.start_offset, stop))
            cols.data.extend(itertools.repeat(b"x" * size, n))
            cols.ordering_keys.extend(itertools.repeat("", n))
            cols.publish_time_us.extend(itertools.repeat(int(time.time() * 1e6), n))
            cols.attribute_counts.extend(itertools.repeat(0, n))
        return out

    # --- wiring -------------------------------------------------------------------------------

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        def unary(
            fn: Callable[..., Any], req: Any, resp_serializer: Callable[[Any], bytes] | None
        ) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                fn,
                request_deserializer=req.FromString if req is not None else None,
                response_serializer=resp_serializer,
            )

        def ser(cls: Any) -> Callable[[Any], bytes]:
            return cls.SerializeToString  # type: ignore[no-any-return]

        publisher = grpc.method_handlers_generic_handler(
            pb.PUBLISHER,
            {
                "CreateTopic": unary(self.create_topic, pb.Topic, ser(pb.Topic)),
                "GetTopic": unary(self.get_topic, pb.GetTopicRequest, ser(pb.Topic)),
                "DeleteTopic": unary(self.delete_topic, pb.DeleteTopicRequest, ser(pb.Empty)),
                # Raw bytes in and out: no server-side protobuf work beyond counting messages.
                "Publish": unary(self.publish, None, None),
            },
        )
        subscriber = grpc.method_handlers_generic_handler(
            pb.SUBSCRIBER,
            {
                "CreateSubscription": unary(
                    self.create_subscription, pb.Subscription, ser(pb.Subscription)
                ),
                "GetSubscription": unary(
                    self.get_subscription, pb.GetSubscriptionRequest, ser(pb.Subscription)
                ),
                "DeleteSubscription": unary(
                    self.delete_subscription, pb.DeleteSubscriptionRequest, ser(pb.Empty)
                ),
                "Acknowledge": unary(self.acknowledge, pb.AcknowledgeRequest, ser(pb.Empty)),
                "ModifyAckDeadline": unary(
                    self.modify_ack_deadline, pb.ModifyAckDeadlineRequest, ser(pb.Empty)
                ),
                "StreamingPull": grpc.stream_stream_rpc_method_handler(
                    self.streaming_pull,
                    request_deserializer=pb.StreamingPullRequest.FromString,
                    response_serializer=None,
                ),
            },
        )
        replay = grpc.method_handlers_generic_handler(
            "pubsubd.v1.Replay",
            {
                "PublishDeduplicated": unary(
                    self.publish_deduplicated,
                    replay_pb2.PublishDeduplicatedRequest,
                    ser(replay_pb2.PublishDeduplicatedResponse),
                ),
                "GetTopicRanges": unary(
                    self.get_topic_ranges,
                    replay_pb2.GetTopicRangesRequest,
                    ser(replay_pb2.GetTopicRangesResponse),
                ),
                "Read": unary(
                    self.read, replay_pb2.ReadRequest, _bytes_or(replay_pb2.ReadResponse)
                ),
            },
        )
        return [publisher, subscriber, replay]


def _bytes_or(cls: Any) -> Callable[[Any], bytes]:
    """A response serializer that passes bytes (an answer framed by hand) as they are."""

    def serialize(message: Any) -> bytes:
        return message if isinstance(message, bytes) else cls.SerializeToString(message)  # type: ignore[no-any-return]

    return serialize


def _arrow_page(start: int, n: int, size: int) -> Any:
    """A generated page as pubsubd's Arrow ``Read`` batch (``replay_arrow.page_schema``)."""
    import numpy as np
    import pyarrow as pa

    n = max(n, 0)
    schema = replay_arrow.page_schema()
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.arange(start, start + n, dtype=np.int64)),
            pa.array([b"x" * size] * n, pa.binary()),
            pa.nulls(n, pa.string()),
            pa.array(np.full(n, int(time.time() * 1e6)), schema.field("publish_time").type),
            pa.MapArray.from_arrays(
                pa.array(np.zeros(n + 1, np.int32)),
                pa.array([], pa.string()),
                pa.array([], pa.string()),
            ),
        ],
        schema=schema,
    )


def _generated(topic: str) -> tuple[int, int]:
    """(count, size) of a generated topic ``...-{count}-{size}``; (0, 0) for any other."""
    parts = topic.rsplit("-", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return int(parts[1]), int(parts[2])
    return 0, 0


async def serve(host: str, port: int) -> None:
    server = grpc.aio.server(options=GRPC_OPTIONS)
    server.add_generic_rpc_handlers(NullServer().handlers())
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    await server.start()
    log.info("null-server ready grpc=%s:%d", host, bound)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve(args.host, args.port))
    else:
        uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
