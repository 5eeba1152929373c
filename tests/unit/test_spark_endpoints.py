"""Unit tests for the Spark connector's endpoint forms (several frontends) and its retry of a
call that failed because a server went away (pubsubd.spark.client; no server, no Spark)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

pytest.importorskip("pyspark")

from pubsubd._gen.pubsubd.v1 import replay_pb2
from pubsubd.spark import client as spark_client
from pubsubd.spark.client import EndpointError, ReplayClient, ReplayError, channel_target
from pubsubd.spark.options import OptionError, SinkOptions, SourceOptions

pytestmark = pytest.mark.unit

T = "projects/p/topics/t"


@pytest.mark.parametrize(
    ("endpoint", "target"),
    [
        ("127.0.0.1:8085", "127.0.0.1:8085"),
        ("localhost:8085", "localhost:8085"),
        ("ipv4:127.0.0.1:1,127.0.0.1:2", "ipv4:127.0.0.1:1,127.0.0.1:2"),
        ("127.0.0.1:1,127.0.0.1:2", "ipv4:127.0.0.1:1,127.0.0.1:2"),
        (" 127.0.0.1:1 , 127.0.0.1:2 ", "ipv4:127.0.0.1:1,127.0.0.1:2"),
        ("[::1]:1,[::1]:2", "ipv6:[::1]:1,[::1]:2"),
        ("dns:pubsubd.internal:8085", "dns:pubsubd.internal:8085"),
    ],
)
def test_channel_target_takes_one_server_or_a_list(endpoint: str, target: str) -> None:
    assert channel_target(endpoint) == target


@pytest.mark.parametrize(
    "endpoint",
    ["host-a:1,host-b:2", "127.0.0.1:1,[::1]:2", "127.0.0.1,127.0.0.1:2", "::1:1,::1:2"],
)
def test_a_list_gRPC_cannot_resolve_is_refused(endpoint: str) -> None:
    with pytest.raises(EndpointError, match="IP:port"):
        channel_target(endpoint)


def test_options_resolve_the_list_on_the_driver() -> None:
    opts = SourceOptions.parse({"endpoint": "127.0.0.1:1,127.0.0.1:2", "topic": T})
    assert opts.endpoint == "ipv4:127.0.0.1:1,127.0.0.1:2"
    sink = SinkOptions.parse({"ENDPOINT": "ipv4:127.0.0.1:1,127.0.0.1:2", "topic": T})
    assert sink.endpoint == "ipv4:127.0.0.1:1,127.0.0.1:2"
    with pytest.raises(OptionError, match="endpoint"):
        SourceOptions.parse({"endpoint": "a:1,b:2", "topic": T})


class _Failure(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return f"injected {self._code.name}"


class _Channel:
    """Answers every call with the next of ``outcomes`` (an exception is raised)."""

    def __init__(self, outcomes: list[Any]) -> None:
        self.outcomes = outcomes
        self.calls = 0

    def unary_unary(self, method: str, **kwargs: Any) -> Any:
        def call(request: Any, timeout: float, wait_for_ready: bool) -> Any:
            assert timeout > 0 and wait_for_ready
            self.calls += 1
            outcome = self.outcomes.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        return call

    def close(self) -> None:
        pass


def _client(outcomes: list[Any], timeout: float = 5.0) -> tuple[ReplayClient, _Channel]:
    client = ReplayClient("127.0.0.1:1,127.0.0.1:2", timeout=timeout)
    client.close()
    channel = _Channel(outcomes)
    client._channel = channel  # type: ignore[assignment]
    return client, channel


def test_a_call_is_sent_again_after_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spark_client, "_RETRY_FIRST_S", 0.001)
    answer = replay_pb2.GetTopicRangesResponse()
    answer.sources.add(source=0, earliest_offset=3, latest_offset=9)
    unavailable = _Failure(grpc.StatusCode.UNAVAILABLE)
    client, channel = _client([unavailable, unavailable, answer])
    bounds = client.topic_bounds(T)
    assert (bounds[0].earliest, bounds[0].latest) == (3, 9)
    assert (channel.calls, client.retries) == (3, 2)


def test_other_failures_are_not_retried() -> None:
    client, channel = _client([_Failure(grpc.StatusCode.NOT_FOUND)])
    with pytest.raises(ReplayError) as caught:
        client.topic_bounds(T)
    assert (caught.value.code, channel.calls, client.retries) == (grpc.StatusCode.NOT_FOUND, 1, 0)


def test_retries_stop_at_the_calls_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spark_client, "_RETRY_FIRST_S", 0.02)
    client, channel = _client([_Failure(grpc.StatusCode.UNAVAILABLE)] * 100, timeout=0.1)
    with pytest.raises(ReplayError) as caught:
        client.topic_bounds(T)
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert 2 <= channel.calls < 10
