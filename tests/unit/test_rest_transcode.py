"""REST <-> gRPC transcoding (api/rest/transcode.py): bodies, path and query binding, Google's
JSON for responses and errors."""

from __future__ import annotations

import json

import pytest

from pubsubd.api.rest import routes
from pubsubd.api.rest.transcode import RestError, build_request, error_body, response_body
from pubsubd.core import pb

pytestmark = pytest.mark.unit


def _build(verb: str, path: str, body: bytes = b"", **query: list[str]) -> object:
    found = routes.match(verb, path)
    assert found is not None
    return build_request(found, query, body)


def test_publish_body_base64_and_path() -> None:
    body = json.dumps(
        {"messages": [{"data": "aGk=", "attributes": {"k": "v"}, "orderingKey": "o"}]}
    ).encode()
    request = _build("POST", "/v1/projects/p/topics/top:publish", body, alt=["json"])
    assert request.topic == "projects/p/topics/top"
    (message,) = request.messages
    assert (message.data, dict(message.attributes), message.ordering_key) == (
        b"hi",
        {"k": "v"},
        "o",
    )


def test_the_path_wins_over_the_body_and_proto_names_are_accepted() -> None:
    body = json.dumps(
        {"name": "projects/p/topics/other", "ack_deadline_seconds": 30, "topic": "t"}
    ).encode()
    request = _build("PUT", "/v1/projects/p/subscriptions/sub", body)
    assert request.name == "projects/p/subscriptions/sub"
    assert request.ack_deadline_seconds == 30


def test_update_mask_and_duration_in_camel_case() -> None:
    body = json.dumps(
        {
            "subscription": {"ackDeadlineSeconds": 33, "messageRetentionDuration": "3600s"},
            "updateMask": "ackDeadlineSeconds,messageRetentionDuration",
        }
    ).encode()
    request = _build("PATCH", "/v1/projects/p/subscriptions/sub", body)
    assert request.subscription.name == "projects/p/subscriptions/sub"
    assert request.subscription.message_retention_duration.seconds == 3600
    assert list(request.update_mask.paths) == ["ack_deadline_seconds", "message_retention_duration"]


def test_query_binds_the_remaining_fields() -> None:
    request = _build("GET", "/v1/projects/p/topics", pageSize=["7"], pageToken=["abc"])
    assert (request.project, request.page_size, request.page_token) == ("projects/p", 7, "abc")
    request = _build("GET", "/v1/projects/p/topics", page_size=["2"], prettyPrint=["false"])
    assert request.page_size == 2
    request = _build("GET", "/v1/projects/p/schemas/s", view=["FULL"])
    assert request.view == 2  # SchemaView.FULL


def test_a_body_field_rule_takes_the_body_as_that_field() -> None:
    body = b'{"type": "AVRO", "definition": "{}"}'
    request = _build("POST", "/v1/projects/p/schemas", body, schemaId=["s1"])
    assert (request.parent, request.schema_id) == ("projects/p", "s1")
    assert request.schema.definition == "{}"


def test_an_empty_body_is_an_empty_request() -> None:
    request = _build("POST", "/v1/projects/p/subscriptions/sub:detach", b"")
    assert request.subscription == "projects/p/subscriptions/sub"
    request = _build("POST", "/v1/projects/p/subscriptions/sub:pull", b"  \n")
    assert request.max_messages == 0  # the service says what is missing


@pytest.mark.parametrize(
    "body,fragment",
    [
        (b'{"messages": [', "Invalid JSON payload received."),
        (b'{"messages": [{"data": "aGk=",}]}', "Invalid JSON payload received."),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b"\xff\xfe{}", "Invalid JSON payload received."),
        (b'{"foo": 1}', 'no field named "foo"'),
        (b'{"messages": [{"data": "not base64!"}]}', "Base64 decoding failed"),
        (b'{"messages": [{"data": "%%%"}]}', "messages[0].data"),
        (b'{"messages": {"data": "aGk="}}', "Invalid JSON payload received."),
        (b'{"messages": [{"attributes": {"k": 1}}]}', "Invalid JSON payload received."),
        (b'{"messages": [{"publishTime": "yesterday"}]}', "Invalid JSON payload received."),
    ],
)
def test_malformed_bodies_are_invalid_argument(body: bytes, fragment: str) -> None:
    with pytest.raises(RestError) as e:
        _build("POST", "/v1/projects/p/topics/top:publish", body)
    assert (e.value.http, e.value.status) == (400, "INVALID_ARGUMENT")
    assert fragment in e.value.message


@pytest.mark.parametrize(
    "verb,path,query,fragment",
    [
        ("GET", "/v1/projects/p/topics", {"bogus": ["1"]}, 'Unknown name "bogus"'),
        ("GET", "/v1/projects/p/topics", {"pageSize": ["many"]}, "pageSize"),
        ("GET", "/v1/projects/p/topics", {"pageSize": ["99999999999"]}, "pageSize"),
        ("POST", "/v1/projects/p/topics/t:publish", {"topic": ["x"]}, "Cannot bind query"),
        ("GET", "/v1/projects/p/topics", {"alt": ["proto"]}, "alt=proto"),
    ],
)
def test_bad_query_parameters(
    verb: str, path: str, query: dict[str, list[str]], fragment: str
) -> None:
    found = routes.match(verb, path)
    assert found is not None
    with pytest.raises(RestError) as e:
        build_request(found, query, b"")
    assert e.value.http == 400 and fragment in e.value.message


def test_response_json_is_googles() -> None:
    response = pb.PullResponse()
    m = response.received_messages.add(ack_id="a-1", delivery_attempt=2)
    m.message.data = b"\x00\xffhi"
    m.message.message_id = "12"
    m.message.publish_time.FromJsonString("2026-01-02T03:04:05.123Z")
    assert json.loads(response_body(response)) == {
        "receivedMessages": [
            {
                "ackId": "a-1",
                "deliveryAttempt": 2,
                "message": {
                    "data": "AP9oaQ==",
                    "messageId": "12",
                    "publishTime": "2026-01-02T03:04:05.123Z",
                },
            }
        ]
    }
    assert response_body(pb.Empty()) == b"{}\n"
    assert response_body(pb.Empty(), pretty=False) == b"{}"
    sub = pb.Subscription(name="n", ack_deadline_seconds=10)
    sub.message_retention_duration.seconds = 600
    assert json.loads(response_body(sub)) == {
        "name": "n",
        "ackDeadlineSeconds": 10,
        "messageRetentionDuration": "600s",
    }


def test_error_body() -> None:
    assert json.loads(error_body(404, "NOT_FOUND", "Topic not found")) == {
        "error": {"code": 404, "message": "Topic not found", "status": "NOT_FOUND"}
    }
    detail = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "R"}
    assert json.loads(error_body(400, "INVALID_ARGUMENT", "m", [detail]))["error"]["details"] == [
        detail
    ]
