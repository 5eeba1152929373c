"""A spread subscription's fan-out bookkeeping (frontend/fanout.py, pure): which forwarder
serves which sources, and every ack ID routed to the leg of its source."""

from __future__ import annotations

import pytest

from pubsubd.control.routing_table import Forwarder, subscribing_unit
from pubsubd.core import ids
from pubsubd.core.pb import StreamingPullRequest
from pubsubd.frontend.fanout import (
    Leg,
    by_source,
    legs,
    only_sources,
    sources_header,
    split_ack_ids,
    split_streaming_request,
)

pytestmark = pytest.mark.unit

FORWARDERS = {f: Forwarder(f, f"127.0.0.1:{i}") for i, f in enumerate(["a", "b", "c"])}


def _ack(source: int, offset: int = 7) -> str:
    return ids.encode_ack_id("inc", ids.position(source, offset), 1)


def test_the_legs_group_a_spread_subscription_s_sources_by_owner() -> None:
    routes = {subscribing_unit("s", i): ("a" if i % 2 else "b", "c") for i in range(6)}
    got = legs("s", lambda u: routes.get(u, ()), lambda u: u in routes, FORWARDERS)
    assert got == [
        Leg(FORWARDERS["a"], frozenset({1, 3, 5})),
        Leg(FORWARDERS["b"], frozenset({0, 2, 4})),
    ]
    assert sources_header(got[0]) == "1,3,5"


def test_a_source_whose_owner_left_goes_to_its_first_registered_fallback() -> None:
    routes = {subscribing_unit("s", 0): ("gone", "b"), subscribing_unit("s", 1): ("a",)}
    got = legs("s", lambda u: routes.get(u, ()), lambda u: True, FORWARDERS)
    assert got == [Leg(FORWARDERS["a"], frozenset({1})), Leg(FORWARDERS["b"], frozenset({0}))]


def test_a_subscription_served_whole_has_no_legs() -> None:
    routes = {subscribing_unit("s", i): ("a",) for i in range(4)}
    assert legs("s", lambda u: routes.get(u, ()), lambda u: False, FORWARDERS) is None
    assert legs("unknown", lambda u: (), lambda u: True, FORWARDERS) is None


def test_ack_ids_go_to_the_leg_of_their_source_and_unknown_ones_to_the_first() -> None:
    sources = by_source(
        [Leg(FORWARDERS["a"], frozenset({0, 2})), Leg(FORWARDERS["b"], frozenset({1}))]
    )
    split = split_ack_ids([_ack(0), _ack(1), _ack(2), _ack(9), "garbage"], sources)
    assert split == {0: [_ack(0), _ack(2), _ack(9), "garbage"], 1: [_ack(1)]}


def test_a_stream_request_is_split_by_source_and_every_leg_gets_one() -> None:
    sources = {0: 0, 1: 1}
    request = StreamingPullRequest(
        subscription="projects/p/subscriptions/s",
        ack_ids=[_ack(0), _ack(1)],
        modify_deadline_ack_ids=[_ack(1, 3), _ack(0, 4), _ack(1, 5)],
        modify_deadline_seconds=[10, 0, 30],
        stream_ack_deadline_seconds=60,
        client_id="c",
    )
    first, second = split_streaming_request(request, sources, 2)
    assert list(first.ack_ids) == [_ack(0)] and list(second.ack_ids) == [_ack(1)]
    assert list(first.modify_deadline_ack_ids) == [_ack(0, 4)]
    assert list(first.modify_deadline_seconds) == [0]
    assert list(second.modify_deadline_ack_ids) == [_ack(1, 3), _ack(1, 5)]
    assert list(second.modify_deadline_seconds) == [10, 30]
    for part in (first, second):
        assert part.subscription == request.subscription
        assert (part.stream_ack_deadline_seconds, part.client_id) == (60, "c")
    # A heartbeat (empty request) reaches every leg: each sees the client alive.
    assert split_streaming_request(StreamingPullRequest(), sources, 2) == [
        StreamingPullRequest(),
        StreamingPullRequest(),
    ]


def test_mismatched_deadline_lists_go_whole_to_every_leg() -> None:
    request = StreamingPullRequest(
        modify_deadline_ack_ids=[_ack(0), _ack(1)], modify_deadline_seconds=[10]
    )
    assert split_streaming_request(request, {0: 0, 1: 1}, 2) == [request, request]


def test_the_source_of_an_ack_id_of_any_incarnation() -> None:
    assert ids.ack_id_source(ids.encode_ack_id("x1", ids.position(5, 123), 2)) == 5
    assert ids.ack_id_source("not-an-ack-id") is None
    assert ids.ack_id_source("a-1-2-3" + "9" * 200) is None


def test_a_stream_asking_for_sources_gets_only_the_legs_serving_them() -> None:
    a, b = Leg(FORWARDERS["a"], frozenset({1, 3, 5})), Leg(FORWARDERS["b"], frozenset({0, 2, 4}))
    assert only_sources([a, b], None) == [a, b]
    assert only_sources([a, b], frozenset({3})) == [Leg(FORWARDERS["a"], frozenset({3}))]
    assert only_sources([a, b], frozenset({2, 5})) == [
        Leg(FORWARDERS["a"], frozenset({5})),
        Leg(FORWARDERS["b"], frozenset({2})),
    ]
    assert only_sources([a, b], frozenset({7})) == []  # nobody serves it (yet)
