"""Lower-level tools for integration tests: raw StreamingPull streams, GAPIC clients, HTTP probes
(the /status page: tests/support/status.py).

The hand-written ``PublisherClient`` batches and checks sizes client-side, and ``subscribe()``
hides the stream; these helpers reach the server the way a misbehaving or minimal client would.
"""

from __future__ import annotations

import queue
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
from google.pubsub_v1 import PublisherClient as GapicPublisherClient
from google.pubsub_v1 import types

from tests.conftest import emulator_host
from tests.support.server import ServerProcess

# Raw protobuf classes (the proto-plus wrappers' underlying messages).
StreamingPullRequest: Any = types.StreamingPullRequest.pb()
StreamingPullResponse: Any = types.StreamingPullResponse.pb()
PublishRequest: Any = types.PublishRequest.pb()
PubsubMessage: Any = types.PubsubMessage.pb()

STREAMING_PULL = "/google.pubsub.v1.Subscriber/StreamingPull"


def gapic_publisher(endpoint: str) -> GapicPublisherClient:
    """The generated (non-batching) publisher: one Publish RPC per call, no client-side limits."""
    with emulator_host(endpoint):
        return GapicPublisherClient()


def http_get(server: ServerProcess, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    url = f"http://{server.host}:{server.http_port}{path}"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.read()


class RawStream:
    """One StreamingPull driven by hand: send requests, read responses, vanish."""

    _END = object()

    def __init__(
        self,
        endpoint: str,
        first: Any,
        timeout: float = 120.0,
        channel: grpc.Channel | None = None,
    ) -> None:
        self.channel = channel or grpc.insecure_channel(endpoint)
        self._requests: queue.Queue[Any] = queue.Queue()
        self._requests.put(first)
        self._responses: queue.Queue[Any] = queue.Queue()
        self.error: grpc.RpcError | None = None
        self.ended = threading.Event()
        method = self.channel.stream_stream(
            STREAMING_PULL,
            request_serializer=StreamingPullRequest.SerializeToString,
            response_deserializer=StreamingPullResponse.FromString,
        )
        self.call = method(self._request_iter(), timeout=timeout)
        self._reader = threading.Thread(target=self._read, daemon=True, name="raw-stream")
        self._reader.start()

    def _request_iter(self) -> Iterator[Any]:
        while True:
            item = self._requests.get()
            if item is self._END:
                return
            yield item

    def _read(self) -> None:
        try:
            for response in self.call:
                self._responses.put(response)
        except grpc.RpcError as e:
            self.error = e
        finally:
            self.ended.set()

    def send(self, request: Any) -> None:
        self._requests.put(request)

    def half_close(self) -> None:
        self._requests.put(self._END)

    def receive(self, count: int, timeout: float) -> list[Any]:
        """ReceivedMessages until ``count`` arrived or ``timeout`` passed (may return fewer)."""
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                response = self._responses.get(timeout=min(left, 0.1))
            except queue.Empty:
                if self.ended.is_set() and self._responses.empty():
                    break
                continue
            out.extend(response.received_messages)
        return out

    def receive_within(self, seconds: float) -> list[Any]:
        """Everything that arrives within ``seconds`` (used to show that nothing more comes)."""
        return self.receive(1 << 30, seconds)

    def status_code(self, timeout: float) -> grpc.StatusCode | None:
        """The code the stream ended with (waits up to ``timeout``); None if still open."""
        if not self.ended.wait(timeout):
            return None
        return self.error.code() if self.error is not None else grpc.StatusCode.OK

    def vanish(self) -> None:
        """Drop the connection without a goodbye: close the channel under the open stream."""
        self.channel.close()
        self.ended.wait(5)

    def close(self) -> None:
        self.half_close()
        self.call.cancel()
        self.channel.close()
