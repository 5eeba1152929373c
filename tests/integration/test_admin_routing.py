"""The routing constraints through the admin API (issue 11: ``pubsubd.v1.Admin``
GetRoutingConstraints / ChangeRoutingConstraints), in every deployment: a server that is not
part of a cluster refuses with FAILED_PRECONDITION; in a cluster a change made through the
frontend is read back, bad changes are refused with INVALID_ARGUMENT or NOT_FOUND, and every
change is undone (other tests share the cluster). Drains and pins name forwarders and zones
that do not exist, so the shared cluster's routing is not disturbed."""

from __future__ import annotations

import uuid
from typing import Any

import grpc
import pytest

from pubsubd._gen.pubsubd.v1 import admin_pb2 as a
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

SERVICE = "/pubsubd.v1.Admin/"


def _call(endpoint: str, method: str, request: Any) -> Any:
    with grpc.insecure_channel(endpoint) as channel:
        stub = channel.unary_unary(
            SERVICE + method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=a.RoutingConstraints.FromString,
        )
        return stub(request, timeout=30)


def _change(endpoint: str, **change: Any) -> Any:
    return _call(endpoint, "ChangeRoutingConstraints", a.ChangeRoutingConstraintsRequest(**change))


def test_routing_constraints_through_the_admin_api(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    endpoint = shared_server.endpoint
    if isinstance(shared_server, ServerProcess):  # one process, no cluster
        with pytest.raises(grpc.RpcError) as refused:
            _call(endpoint, "GetRoutingConstraints", a.GetRoutingConstraintsRequest())
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not part of a cluster" in (refused.value.details() or "")
        return
    pub, _ = clients
    topic = names.topic()
    pub.create_topic(name=topic)
    tag = uuid.uuid4().hex[:8]
    forwarder, zone = f"absent-forwarder-{tag}", f"absent-zone-{tag}"
    try:
        drained = _change(endpoint, drain_forwarder=forwarder)
        assert forwarder in drained.drained_forwarders
        assert (
            forwarder
            in _call(
                endpoint, "GetRoutingConstraints", a.GetRoutingConstraintsRequest()
            ).drained_forwarders
        )
        assert zone in _change(endpoint, drain_zone=zone).drained_zones
        pinned = _change(endpoint, pin_topic=a.TopicPin(topic=topic, forwarder_id=forwarder))
        assert pinned.pinned_topics[topic] == forwarder

        bad = {
            "no change": ({}, grpc.StatusCode.INVALID_ARGUMENT),
            "empty forwarder": ({"drain_forwarder": ""}, grpc.StatusCode.INVALID_ARGUMENT),
            "pin without forwarder": (
                {"pin_topic": a.TopicPin(topic=topic)},
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
            "pin a missing topic": (
                {"pin_topic": a.TopicPin(topic=names.topic("missing"), forwarder_id="f")},
                grpc.StatusCode.NOT_FOUND,
            ),
        }
        for what, (change, code) in bad.items():
            with pytest.raises(grpc.RpcError) as refused:
                _change(endpoint, **change)
            assert refused.value.code() == code, what
    finally:
        _change(endpoint, unpin_topic=topic)
        _change(endpoint, undrain_zone=zone)
        after = _change(endpoint, undrain_forwarder=forwarder)
    assert forwarder not in after.drained_forwarders and zone not in after.drained_zones
    assert topic not in after.pinned_topics
