"""A Pull or StreamingPull client in its own process, to be stopped and killed by a test.

Usage: python -m tests.support.killable_puller ENDPOINT SUBSCRIPTION MODE [MAX_MESSAGES]

MODE is ``official`` (one Pull through the official ``SubscriberClient``), ``raw`` (one Pull on a
plain gRPC channel) or ``stream`` (one StreamingPull on a plain channel, 60 s ack deadline, no
flow control). It prints ``ready`` once its channel is connected and ``pulling`` as the call goes
out, then one JSON line per response with the message IDs received, if it lives that long.

The plain channels do no BDP probing, so the client's HTTP/2 receive window stays at its
initial 64 KiB: while the process is stopped (SIGSTOP), a larger response cannot leave the
server, which lets a test kill the client after the server handed it messages.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import grpc

PULL = "/google.pubsub.v1.Subscriber/Pull"
STREAMING_PULL = "/google.pubsub.v1.Subscriber/StreamingPull"
CHANNEL_OPTIONS = [("grpc.http2.bdp_probe", 0), ("grpc.max_receive_message_length", -1)]


def _say(line: Any) -> None:
    sys.stdout.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    sys.stdout.flush()


def _ids(response: Any) -> list[str]:
    return [m.message.message_id for m in response.received_messages]


def main() -> None:
    endpoint, subscription, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    max_messages = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
    from google.pubsub_v1 import types

    request: Any
    if mode == "official":
        from tests.conftest import make_subscriber

        client = make_subscriber(endpoint)
        _say("ready")
        _say("pulling")
        response = client.pull(
            request={"subscription": subscription, "max_messages": max_messages}, timeout=120
        )
        _say({"ids": _ids(response)})
    else:
        channel = grpc.insecure_channel(endpoint, options=CHANNEL_OPTIONS)
        grpc.channel_ready_future(channel).result(timeout=30)
        _say("ready")
        if mode == "raw":
            pull = channel.unary_unary(
                PULL,
                request_serializer=types.PullRequest.pb().SerializeToString,
                response_deserializer=types.PullResponse.pb().FromString,
            )
            request = types.PullRequest.pb()(subscription=subscription, max_messages=max_messages)
            _say("pulling")
            _say({"ids": _ids(pull(request, timeout=120))})
        else:
            stream = channel.stream_stream(
                STREAMING_PULL,
                request_serializer=types.StreamingPullRequest.pb().SerializeToString,
                response_deserializer=types.StreamingPullResponse.pb().FromString,
            )
            first = types.StreamingPullRequest.pb()(
                subscription=subscription, stream_ack_deadline_seconds=60
            )
            hold = threading.Event()

            def requests() -> Any:
                yield first
                hold.wait()  # never half-close

            _say("pulling")
            for response in stream(requests(), timeout=600):
                _say({"ids": _ids(response)})
    threading.Event().wait()  # stay until killed


if __name__ == "__main__":
    main()
