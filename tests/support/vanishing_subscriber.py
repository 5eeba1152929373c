"""A StreamingPull client in its own process, to be killed with SIGKILL by a test.

Usage: python -m tests.support.vanishing_subscriber ENDPOINT SUBSCRIPTION ACK_DEADLINE

Prints one JSON line per received message ({"message_id", "ack_id"}) and never acks; it runs
until killed, so the server sees the connection drop without any gRPC or HTTP/2 goodbye.
"""

from __future__ import annotations

import json
import sys
import threading

from tests.support.raw import RawStream, StreamingPullRequest


def main() -> None:
    endpoint, subscription, deadline = sys.argv[1], sys.argv[2], int(sys.argv[3])
    stream = RawStream(
        endpoint,
        StreamingPullRequest(subscription=subscription, stream_ack_deadline_seconds=deadline),
        timeout=600,
    )
    while not stream.ended.is_set():
        for m in stream.receive(1, 0.5):
            line = {"message_id": m.message.message_id, "ack_id": m.ack_id}
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()
    sys.stdout.write(json.dumps({"ended": str(stream.error)}) + "\n")
    sys.stdout.flush()
    threading.Event().wait()


if __name__ == "__main__":
    main()
