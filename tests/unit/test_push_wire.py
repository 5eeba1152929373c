"""Unit tests for pubsubd.data.subscribe.push_wire: push requests, backoff, the AIMD window."""

from __future__ import annotations

import base64
import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pubsubd.core import pb, validation
from pubsubd.core.errors import InvalidArgument
from pubsubd.data.subscribe import push_wire
from pubsubd.data.subscribe.push_wire import AimdWindow, backoff_s

pytestmark = pytest.mark.unit

SUB = "projects/p/subscriptions/s"


def _message(**kwargs: object) -> object:
    m = pb.PubsubMessage(message_id="42", **kwargs)
    m.publish_time.FromJsonString("2021-02-26T19:13:55.749Z")
    return m


# --- wrapped body -----------------------------------------------------------------------------


def test_wrapped_body_has_googles_fields() -> None:
    m = _message(data=b"Hello Cloud Pub/Sub!", attributes={"key": "value"})
    body = json.loads(push_wire.wrapped_body(m, SUB))
    assert body == {
        "message": {
            "data": base64.b64encode(b"Hello Cloud Pub/Sub!").decode(),
            "attributes": {"key": "value"},
            "messageId": "42",
            "message_id": "42",
            "publishTime": "2021-02-26T19:13:55.749Z",
            "publish_time": "2021-02-26T19:13:55.749Z",
        },
        "subscription": SUB,
    }


def test_wrapped_body_optional_fields() -> None:
    m = _message(data=b"", ordering_key="k1")
    body = json.loads(push_wire.wrapped_body(m, SUB, delivery_attempt=3))
    assert body["message"]["orderingKey"] == "k1"
    assert body["message"]["data"] == ""
    assert "attributes" not in body["message"]
    assert body["deliveryAttempt"] == 3
    plain = json.loads(push_wire.wrapped_body(_message(data=b"x"), SUB))
    assert "deliveryAttempt" not in plain
    assert "orderingKey" not in plain["message"]


def test_wrapped_body_binary_and_unicode() -> None:
    data = bytes(range(256))
    m = _message(data=data, attributes={"ключ": "значение ✓"})
    raw = push_wire.wrapped_body(m, SUB)
    body = json.loads(raw.decode("utf-8"))
    assert base64.b64decode(body["message"]["data"]) == data
    assert body["message"]["attributes"] == {"ключ": "значение ✓"}


def test_publish_time_precision() -> None:
    m = pb.PubsubMessage()
    m.publish_time.seconds = 1_600_000_000
    assert push_wire.publish_time(m) == "2020-09-13T12:26:40Z"
    m.publish_time.nanos = 123_456_789
    assert push_wire.publish_time(m) == "2020-09-13T12:26:40.123456789Z"


# --- request: wrapper vs no_wrapper -----------------------------------------------------------


def test_request_default_is_json_wrapper() -> None:
    config = pb.PushConfig(push_endpoint="http://127.0.0.1:1/push")
    body, headers = push_wire.request(config, SUB, _message(data=b"d"))
    assert dict(headers)[b"content-type"] == b"application/json"
    assert json.loads(body)["message"]["data"] == base64.b64encode(b"d").decode()


def test_request_no_wrapper_without_metadata_is_raw_data() -> None:
    config = pb.PushConfig(push_endpoint="http://127.0.0.1:1/push")
    config.no_wrapper.write_metadata = False
    body, headers = push_wire.request(config, SUB, _message(data=b"\x00raw", attributes={"a": "1"}))
    assert body == b"\x00raw"
    assert headers == [(b"content-type", b"application/octet-stream")]


def test_request_no_wrapper_with_metadata_headers() -> None:
    config = pb.PushConfig(push_endpoint="http://127.0.0.1:1/push")
    config.no_wrapper.write_metadata = True
    m = _message(data=b"raw", attributes={"Tenant": "acme", "content-type": "text/plain"})
    m.ordering_key = "k"
    body, headers = push_wire.request(config, SUB, m)
    h = dict(headers)
    assert body == b"raw"
    assert h[b"x-goog-pubsub-subscription-name"] == SUB.encode()
    assert h[b"x-goog-pubsub-message-id"] == b"42"
    assert h[b"x-goog-pubsub-publish-time"] == b"2021-02-26T19:13:55.749Z"
    assert h[b"x-goog-pubsub-ordering-key"] == b"k"
    assert h[b"tenant"] == b"acme"
    # An attribute may set the content type; then no default is added.
    assert [v for k, v in headers if k == b"content-type"] == [b"text/plain"]


def test_metadata_headers_skip_what_http_cannot_carry() -> None:
    m = _message(
        attributes={
            "ok": " padded\t",
            "bad name": "x",
            "newline": "a\r\nInjected: 1",
            "content-length": "0",
            "Host": "evil",
            "transfer-encoding": "chunked",
            "x-goog-pubsub-message-id": "spoofed",
            "unicode": "ünï",
        }
    )
    h = push_wire.metadata_headers(m, SUB)
    names = [k for k, _ in h]
    assert len(names) == len(set(names))
    d = dict(h)
    assert d[b"ok"] == b"padded"
    assert d[b"unicode"] == "ünï".encode()
    assert d[b"x-goog-pubsub-message-id"] == b"42"
    for gone in (b"bad name", b"newline", b"content-length", b"host", b"transfer-encoding"):
        assert gone not in d


def test_ack_statuses() -> None:
    assert [s for s in range(100, 600) if push_wire.acknowledges(s)] == [102, 200, 201, 202, 204]


# --- endpoint validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8080/push", "https://example.com/p?q=1", "http://[::1]:9/x"]
)
def test_push_endpoint_accepts_http_urls(url: str) -> None:
    validation.push_endpoint(url)


@pytest.mark.parametrize(
    "url",
    [
        "example.com/push",
        "ftp://example.com/",
        "http:///nohost",
        "http://h:notaport/",
        "http://[::1",
        "http://a b/",
    ],
)
def test_push_endpoint_rejects_others(url: str) -> None:
    with pytest.raises(InvalidArgument, match="push_endpoint"):
        validation.push_endpoint(url)


# --- backoff ----------------------------------------------------------------------------------


def test_backoff_doubles_from_minimum_to_maximum() -> None:
    got = [backoff_s(n, 0.1, 60.0) for n in range(1, 13)]
    assert got[:4] == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert got[-1] == 60.0
    assert all(b >= a for a, b in itertools.pairwise(got))
    assert backoff_s(0, 0.1, 60.0) == 0.0
    assert backoff_s(10_000, 0.1, 60.0) == 60.0  # no overflow
    assert backoff_s(3, 0.0, 60.0) == 0.0
    assert backoff_s(3, 5.0, 1.0) == 5.0  # a maximum below the minimum is the minimum


@given(st.integers(1, 200), st.floats(0.001, 100), st.floats(0.001, 1000))
def test_backoff_stays_in_bounds(n: int, low: float, high: float) -> None:
    d = backoff_s(n, low, high)
    assert low <= d <= max(low, high)


# --- AIMD window ------------------------------------------------------------------------------


def test_window_starts_small_and_limits_in_flight() -> None:
    w = AimdWindow(initial=4)
    assert w.size == 4 and w.available() == 4
    seqs = [w.start() for _ in range(4)]
    assert w.available() == 0
    w.cancel(seqs[0])
    assert w.available() == 1 and w.size == 4


def test_window_grows_on_success_up_to_maximum() -> None:
    w = AimdWindow(initial=4, maximum=50)
    for _ in range(10):
        w.end(w.start(), ok=True)
    assert w.size == 14  # slow start: +1 per success
    for _ in range(1000):
        w.end(w.start(), ok=True)
    assert w.size == 50


def test_window_halves_on_failure_once_per_window() -> None:
    w = AimdWindow(initial=16, maximum=100)
    seqs = [w.start() for _ in range(16)]
    for s in seqs:  # a whole window fails at once: one congestion event
        w.end(s, ok=False)
    assert w.size == 8
    s = w.start()  # sent after the decrease: a new event
    w.end(s, ok=False)
    assert w.size == 4
    for _ in range(5):
        w.end(w.start(), ok=False)
    assert w.size == 1  # never below the minimum
    assert w.available() == 1


def test_window_grows_additively_after_a_failure() -> None:
    w = AimdWindow(initial=8, maximum=100)
    w.end(w.start(), ok=False)
    assert w.size == 4
    for _ in range(4):  # one round trip of successes: +1, not doubling
        w.end(w.start(), ok=True)
    assert w.size == 4 or w.size == 5
    for _ in range(40):
        w.end(w.start(), ok=True)
    assert 8 <= w.size <= 12


def test_window_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError):
        AimdWindow(initial=0)
    with pytest.raises(ValueError):
        AimdWindow(initial=10, maximum=5)


@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=300))
def test_window_invariants(ops: list[tuple[bool, bool]]) -> None:
    w = AimdWindow(initial=4, minimum=1, maximum=64)
    open_: list[int] = []
    for start, ok in ops:
        if start or not open_:
            open_.append(w.start())
        else:
            w.end(open_.pop(0), ok)
        assert 1 <= w.size <= 64
        assert w.in_flight == len(open_)
        assert w.available() == max(0, w.size - len(open_))
