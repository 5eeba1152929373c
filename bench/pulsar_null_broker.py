"""A "null" Pulsar broker: the fastest server the Pulsar client can talk to, for its ceiling.

It stores nothing: a SEND is answered at once with a receipt (consecutive entry IDs); a consumer
of a topic whose name ends in ``-prebuilt-N`` gets N generated 100-byte messages as fast as its
FLOW permits allow, one per MESSAGE, or with ``--batch B`` up to B per MESSAGE as a Pulsar batch
(``pulsar/messages.batch_frame``, what pubsubd's front sends); acks are dropped. It speaks only
what the benchmark's client uses (CONNECT, PING, PARTITIONED_METADATA, LOOKUP, PRODUCER, SEND,
CLOSE_PRODUCER, SUBSCRIBE, FLOW, ACK, CLOSE_CONSUMER) with pubsubd's own frame codec.

Run: ``python -m bench.pulsar_null_broker --port 0 [--batch B]``; it prints
``null-pulsar ready port=N``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re

from pubsubd.core import pb
from pubsubd.pulsar import commands, frames, messages
from pubsubd.pulsar.api import BaseCommand, Type

_PREBUILT = re.compile(r"-prebuilt-(\d+)$")
T = {name: Type.Value(name) for name in Type.keys()}  # noqa: SIM118


class NullConnection:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, batch: int = 1
    ) -> None:
        self.reader, self.writer = reader, writer
        self.batch = batch
        self.decoder = frames.FrameDecoder()
        self.entry = 0
        self.consumers: dict[int, list[int]] = {}  # consumer id -> [next, total, permits]
        host, port = writer.get_extra_info("sockname")[:2]
        self.url = f"pulsar://{host}:{port}"
        self.message = pb.PubsubMessage(data=b"x" * 100)
        self.message.publish_time.seconds = 1

    async def serve(self) -> None:
        try:
            while data := await self.reader.read(256 * 1024):
                for frame in self.decoder.feed(data):
                    cmd = BaseCommand()
                    cmd.ParseFromString(frame.command)
                    self.handle(cmd)
                await self.writer.drain()
        except (ConnectionError, frames.FrameError):
            pass
        finally:
            self.writer.close()

    def handle(self, cmd: BaseCommand) -> None:
        w = self.writer.write
        t = cmd.type
        if t == T["SEND"]:
            n = max(cmd.send.num_messages, 1)
            s = cmd.send
            w(
                commands.send_receipt(
                    s.producer_id, s.sequence_id, s.highest_sequence_id, 0, self.entry
                )
            )
            self.entry += n
        elif t == T["FLOW"]:
            state = self.consumers.get(cmd.flow.consumer_id)
            if state is not None:
                state[2] += cmd.flow.messagePermits
                self.pump(cmd.flow.consumer_id, state)
        elif t in (T["ACK"], T["PONG"]):
            pass
        elif t == T["CONNECT"]:
            w(commands.connected(cmd.connect.protocol_version, "null-pulsar"))
        elif t == T["PING"]:
            w(commands.pong())
        elif t == T["PARTITIONED_METADATA"]:
            w(commands.partitioned_metadata(cmd.partitionMetadata.request_id, 0))
        elif t == T["LOOKUP"]:
            w(commands.lookup_connect(cmd.lookupTopic.request_id, self.url))
        elif t == T["PRODUCER"]:
            p = cmd.producer
            w(
                commands.producer_success(
                    p.request_id, p.producer_name or f"null-{p.producer_id}", -1
                )
            )
        elif t == T["SUBSCRIBE"]:
            s = cmd.subscribe
            m = _PREBUILT.search(s.topic)
            self.consumers[s.consumer_id] = [0, int(m.group(1)) if m else 0, 0]
            w(commands.success(s.request_id))
        elif t == T["CLOSE_PRODUCER"]:
            w(commands.success(cmd.close_producer.request_id))
        elif t == T["CLOSE_CONSUMER"]:
            self.consumers.pop(cmd.close_consumer.consumer_id, None)
            w(commands.success(cmd.close_consumer.request_id))

    def pump(self, consumer_id: int, state: list[int]) -> None:
        out = []
        while state[2] > 0 and state[0] < state[1]:
            n = min(self.batch, state[2], state[1] - state[0])
            if n > 1:
                batch = [self.message] * n
                out.append(messages.batch_frame(consumer_id, 0, state[0], 0, batch))
            else:
                out.append(messages.message_frame(consumer_id, 0, state[0], 0, self.message))
            state[0] += n
            state[2] -= n
        if out:
            self.writer.write(b"".join(out))


async def main(port: int, batch: int) -> None:
    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await NullConnection(r, w, batch).serve()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    print(f"null-pulsar ready port={server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--batch", type=int, default=1, help="messages per MESSAGE, at most")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(args.port, args.batch))
