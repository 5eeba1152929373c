"""Subscription filters with the official client (docs/GOOGLE_API.md §4 filter, §7.7).

A bad filter fails CreateSubscription with INVALID_ARGUMENT naming the position; a good one
delivers only matching messages (Pull and subscribe()), and the others are acknowledged by the
server: never delivered, and not in the backlog.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1

from tests.support.server import ServerProcess, wait_for
from tests.support.status import sub_status

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:The return_immediately flag is deprecated"),
]

FILTER = '(attributes.color = "red" OR hasPrefix(attributes.shape, "sq")) AND NOT attributes:skip'

# (attributes, matches FILTER); a message with no attributes carries data only.
CASES: list[tuple[dict[str, str], bool]] = [
    ({"color": "red"}, True),
    ({"color": "blue"}, False),
    ({"shape": "square"}, True),
    ({}, False),
    ({"color": "red", "skip": ""}, False),
    ({"shape": "sq"}, True),
    ({"shape": "circle", "color": "Red"}, False),
    ({"color": "red", "shape": "square", "other": "x"}, True),
    ({"shape": "SQUARE"}, False),  # the last ones do not match: the tail must be skipped too
    ({"skip": "1", "color": "red"}, False),
]


def _publish_cases(pub: pubsub_v1.PublisherClient, topic: str) -> dict[bytes, bool]:
    expected: dict[bytes, bool] = {}
    futures = []
    for i, (attrs, matches) in enumerate(CASES):
        data = f"m{i}".encode()
        expected[data] = matches
        futures.append(pub.publish(topic, data, **attrs))
    for f in futures:
        f.result(timeout=60)
    return expected


def _backlog(server: ServerProcess, name: str) -> int | None:
    status = sub_status(server, name)
    return status.get("backlog") if status else None


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ('attributes.color = "red")', 24),
        ("attributes:a AND attributes:b OR attributes:c", 30),
        ('attributes.color == "red"', 18),
        ('attributes.color = "red', 19),
        ("attributes.color = red", 19),
    ],
)
def test_bad_filter_is_invalid_argument_with_position(
    clients: Any, names: Any, text: str, position: int
) -> None:
    pub, sub = clients
    topic = names.topic()
    pub.create_topic(name=topic)
    with pytest.raises(exceptions.InvalidArgument) as e:
        sub.create_subscription(
            request={"name": names.subscription(), "topic": topic, "filter": text}
        )
    assert "filter" in e.value.message
    assert f"at position {position}" in e.value.message, e.value.message
    with pytest.raises(exceptions.NotFound):  # nothing was created
        sub.get_subscription(request={"subscription": names.subscription()})


def test_filter_too_long(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic = names.topic()
    pub.create_topic(name=topic)
    text = " OR ".join(f'attributes.k{i} = "v"' for i in range(20))
    assert len(text) > 256
    with pytest.raises(exceptions.InvalidArgument, match="256 bytes"):
        sub.create_subscription(
            request={"name": names.subscription(), "topic": topic, "filter": text}
        )


def test_filter_is_stored_and_returned(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic = names.topic()
    pub.create_topic(name=topic)
    name = names.subscription()
    created = sub.create_subscription(request={"name": name, "topic": topic, "filter": FILTER})
    assert created.filter == FILTER
    assert sub.get_subscription(request={"subscription": name}).filter == FILTER


def test_pull_delivers_only_matching_messages(
    clients: Any, names: Any, shared_server: ServerProcess
) -> None:
    pub, sub = clients
    topic = names.topic()
    pub.create_topic(name=topic)
    filtered, everything = names.subscription("filtered"), names.subscription("all")
    sub.create_subscription(request={"name": filtered, "topic": topic, "filter": FILTER})
    sub.create_subscription(request={"name": everything, "topic": topic})
    expected = _publish_cases(pub, topic)
    matching = {d for d, m in expected.items() if m}

    got: list[Any] = []

    def pull_more() -> bool:
        resp = sub.pull(request={"subscription": filtered, "max_messages": 100}, timeout=5)
        got.extend(resp.received_messages)
        return len(got) >= len(matching)

    wait_for(pull_more, 30, f"{len(matching)} matching messages on {filtered}")
    assert sorted(r.message.data for r in got) == sorted(matching)
    for r in got:
        assert expected[r.message.data], r.message
    sub.acknowledge(request={"subscription": filtered, "ack_ids": [r.ack_id for r in got]})

    # Non-matching messages are acknowledged by the server: the backlog drains to zero ...
    wait_for(lambda: _backlog(shared_server, filtered) == 0, 10, f"backlog 0 on {filtered}")
    # ... and they are never delivered, not even later.
    resp = sub.pull(request={"subscription": filtered, "max_messages": 100}, timeout=5)
    assert list(resp.received_messages) == []
    assert _backlog(shared_server, filtered) == 0

    # The unfiltered subscription of the same topic still gets everything.
    assert _backlog(shared_server, everything) == len(CASES)
    rest: list[Any] = []
    wait_for(
        lambda: (
            rest.extend(
                sub.pull(
                    request={"subscription": everything, "max_messages": 100}, timeout=5
                ).received_messages
            )
            or len(rest) >= len(CASES)
        ),
        30,
        f"{len(CASES)} messages on {everything}",
    )
    assert sorted(r.message.data for r in rest) == sorted(expected)


def test_subscribe_delivers_only_matching_messages(
    clients: Any, names: Any, shared_server: ServerProcess
) -> None:
    """StreamingPull via subscribe(); also `!=`, which matches messages without the key."""
    pub, sub = clients
    topic = names.topic()
    pub.create_topic(name=topic)
    name = names.subscription()
    sub.create_subscription(
        request={"name": name, "topic": topic, "filter": 'attributes.kind != "noise"'}
    )
    cases = [
        ({"kind": "noise"}, False),
        ({"kind": "signal"}, True),
        ({}, True),  # no kind at all: != matches
        ({"other": "noise"}, True),
        ({"kind": "noise", "x": "y"}, False),
        ({"kind": "Noise"}, True),
        ({"kind": "noise"}, False),
    ]
    lock = threading.Lock()
    received: list[bytes] = []

    def callback(message: Any) -> None:
        with lock:
            received.append(message.data)
        message.ack()

    future = sub.subscribe(name, callback)
    try:
        futures = [
            pub.publish(topic, f"s{i}".encode(), **attrs) for i, (attrs, _) in enumerate(cases)
        ]
        for f in futures:
            f.result(timeout=60)
        want = sorted(f"s{i}".encode() for i, (_, m) in enumerate(cases) if m)
        wait_for(lambda: len(received) >= len(want), 30, f"{len(want)} messages via subscribe()")
        wait_for(lambda: _backlog(shared_server, name) == 0, 10, f"backlog 0 on {name}")
        # A negative check, so a fixed wait: anything non-matching would have come by now.
        time.sleep(1.0)
        with lock:
            assert sorted(received) == want
    finally:
        future.cancel()
        future.result(timeout=30)


def test_filter_applies_to_messages_published_before_a_consumer(
    clients: Any, names: Any, shared_server: ServerProcess
) -> None:
    """Only non-matching messages: none is delivered and the backlog ends at zero."""
    pub, sub = clients
    topic = names.topic()
    pub.create_topic(name=topic)
    name = names.subscription()
    sub.create_subscription(
        request={"name": name, "topic": topic, "filter": 'attributes.env = "prod"'}
    )
    for f in [pub.publish(topic, b"x", env="dev") for _ in range(20)]:
        f.result(timeout=60)
    resp = sub.pull(request={"subscription": name, "max_messages": 100}, timeout=5)
    assert list(resp.received_messages) == []
    wait_for(lambda: _backlog(shared_server, name) == 0, 10, f"backlog 0 on {name}")
    pub.publish(topic, b"y", env="prod").result(timeout=60)
    got: list[Any] = []
    wait_for(
        lambda: (
            got.extend(
                sub.pull(
                    request={"subscription": name, "max_messages": 100}, timeout=5
                ).received_messages
            )
            or len(got) >= 1
        ),
        30,
        "the matching message",
    )
    assert [r.message.data for r in got] == [b"y"]
    assert dict(got[0].message.attributes) == {"env": "prod"}
