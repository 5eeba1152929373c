"""The REST front's fast JSON (api/rest/fast_json.py) gives exactly what json_format gives:
the same text for PullResponses, the same message for the bodies it takes, and it declines
(returns False) whatever json_format would refuse."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubd.api.rest.fast_json import (
    flat_request_from,
    publish_request_from,
    pull_response_json,
)
from pubsubd.core import pb

pytestmark = [pytest.mark.unit, pytest.mark.property]

text = st.text(max_size=12)
keys = st.text(min_size=1, max_size=8)


@st.composite
def pull_responses(draw: st.DrawFn) -> Any:
    response = pb.PullResponse()
    for _ in range(draw(st.integers(0, 4))):
        rm = response.received_messages.add(ack_id=draw(text))
        if draw(st.booleans()):
            m = rm.message
            m.SetInParent()
            m.data = draw(st.binary(max_size=20))
            for k, v in draw(st.dictionaries(keys, text, max_size=3)).items():
                m.attributes[k] = v
            m.message_id = draw(text)
            if draw(st.booleans()):
                m.publish_time.seconds = draw(st.integers(0, 253402300799))
                m.publish_time.nanos = draw(st.sampled_from([0, 1000, 123456789, 5000000]))
            m.ordering_key = draw(text)
        rm.delivery_attempt = draw(st.integers(0, 2**31 - 1))
    return response


@settings(max_examples=200, deadline=None)
@given(pull_responses())
def test_pull_response_text_is_json_formats(response: Any) -> None:
    value = json_format.MessageToDict(response)
    assert pull_response_json(response, True) == (json.dumps(value, indent=2) + "\n").encode()
    assert pull_response_json(response, False) == json.dumps(value, separators=(",", ":")).encode()


def _general(document: Any, cls: Any) -> Any | None:
    message = cls()
    try:
        json_format.ParseDict(document, message, ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError, TypeError):
        return None
    return message


b64 = st.binary(max_size=16).map(lambda b: base64.b64encode(b).decode())
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)
message_fields = st.fixed_dictionaries(
    {},
    optional={
        "data": b64 | json_values,
        "attributes": st.dictionaries(keys, text, max_size=3) | json_values,
        "orderingKey": text | json_values,
        "ordering_key": text,
        "messageId": text,
        "publishTime": st.just("2026-01-01T00:00:00Z"),
        "bogus": json_values,
    },
)
publish_bodies = st.fixed_dictionaries(
    {}, optional={"messages": st.lists(message_fields, max_size=3) | json_values, "topic": text}
)


@settings(max_examples=300, deadline=None)
@given(publish_bodies)
def test_publish_bodies_parse_as_json_formats(document: dict[str, Any]) -> None:
    fast = pb.PublishRequest()
    expected = _general(document, pb.PublishRequest)
    if publish_request_from(document, fast):
        assert expected is not None, document
        assert fast == expected
    else:
        assert fast == pb.PublishRequest()  # untouched


def test_the_common_publish_shape_takes_the_fast_road() -> None:
    document = {
        "messages": [
            {"data": "aGk=", "attributes": {"k": "v"}, "orderingKey": "o"},
            {"attributes": {"only": "x"}},
        ]
    }
    request = pb.PublishRequest()
    assert publish_request_from(document, request)
    assert request == _general(document, pb.PublishRequest)


flat_bodies = st.dictionaries(
    st.sampled_from(
        [
            "subscription",
            "ackIds",
            "ack_ids",
            "ackDeadlineSeconds",
            "ack_deadline_seconds",
            "maxMessages",
            "returnImmediately",
            "bogus",
        ]
    ),
    st.lists(text, max_size=3)
    | st.integers(-(2**33), 2**33)
    | st.booleans()
    | text
    | st.none()
    | st.floats(allow_nan=False),
    max_size=4,
)


@pytest.mark.parametrize(
    "cls", [pb.AcknowledgeRequest, pb.ModifyAckDeadlineRequest, pb.PullRequest]
)
def test_flat_bodies_parse_as_json_formats(cls: Any) -> None:
    @settings(max_examples=150, deadline=None)
    @given(flat_bodies)
    def check(document: dict[str, Any]) -> None:
        fast = cls()
        expected = _general(document, cls)
        if flat_request_from(document, fast):
            assert expected is not None, document
            assert fast == expected
        else:
            assert fast == cls()

    check()
    request = pb.AcknowledgeRequest()
    assert flat_request_from({"ackIds": ["a", "b"], "subscription": "s"}, request)
    assert list(request.ack_ids) == ["a", "b"]
