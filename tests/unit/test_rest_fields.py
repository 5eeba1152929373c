"""The ``fields`` selector of REST partial responses (api/rest/fields.py)."""

from __future__ import annotations

import pytest
from google.pubsub_v1.types import pubsub

from pubsubd.api.rest import fields

pytestmark = pytest.mark.unit

PULL = pubsub.PullResponse.pb().DESCRIPTOR
LIST = pubsub.ListTopicsResponse.pb().DESCRIPTOR


def test_paths_parentheses_and_wildcards() -> None:
    selection = fields.parse(
        "receivedMessages(ackId,message/data),receivedMessages/message/attributes", PULL
    )
    assert selection == {
        "receivedMessages": {"ackId": None, "message": {"data": None, "attributes": None}}
    }
    document = {
        "receivedMessages": [
            {"ackId": "a", "deliveryAttempt": 2, "message": {"data": "eA==", "messageId": "1"}},
            {"ackId": "b", "message": {"attributes": {"k": "v"}, "publishTime": "t"}},
        ]
    }
    assert fields.apply(document, selection) == {
        "receivedMessages": [
            {"ackId": "a", "message": {"data": "eA=="}},
            {"ackId": "b", "message": {"attributes": {"k": "v"}}},
        ]
    }
    assert fields.apply(
        {"topics": [{"name": "n", "labels": {"x": "1"}}]}, fields.parse("topics/*", LIST)
    ) == {"topics": [{"name": "n", "labels": {"x": "1"}}]}


def test_proto_names_map_keys_and_whole_fields_win() -> None:
    assert fields.parse("next_page_token", LIST) == {"nextPageToken": None}
    assert fields.parse("topics/labels/team", LIST) == {"topics": {"labels": {"team": None}}}
    assert fields.parse("topics/name,topics", LIST) == {"topics": None}
    assert fields.parse("topics,topics/name", LIST) == {"topics": None}


@pytest.mark.parametrize(
    "selector",
    [
        "nosuch",
        "topics/nosuch",
        "topics/name/deeper",
        "topics(",
        "topics(name",
        "a,,b",
        "",
        "topics/",
        "top ics)",
    ],
)
def test_bad_selections_are_refused(selector: str) -> None:
    with pytest.raises(fields.FieldSelectionError, match="Invalid field selection"):
        fields.parse(selector, LIST)
