"""Unit tests for pubsubd.core.names: resource-name parsing and validation."""

from __future__ import annotations

import pytest

from pubsubd.core import names
from pubsubd.core.errors import InvalidArgument, InvalidResourceName

pytestmark = pytest.mark.unit

VALID_IDS = [
    "abc",
    "a" * 255,
    "Topic-1",
    "my_topic.v2~x+y%20z",
    "Z12",
    "a--",
    "goo",  # only the prefix "goog" is reserved
    "gog-topic",
    "xgoog",
    "go0g-topic",
]

INVALID_IDS = [
    "ab",  # too short
    "a" * 256,  # too long
    "",
    "1abc",  # must start with a letter
    "-abc",
    "_abc",
    ".abc",
    "%abc",
    "abc def",
    "abc/def",
    "abc*",
    "abc!",
    "abc@x",
    "ab\u00e9",  # only ASCII letters
    "\u00e9abc",
    "abc\n",
    "goog",
    "google-topic",
    "GOOG-topic",
    "Goog123",
    "gOoGle",
]


@pytest.mark.parametrize("rid", VALID_IDS)
def test_valid_topic_and_subscription(rid: str) -> None:
    t = f"projects/my-project/topics/{rid}"
    s = f"projects/my-project/subscriptions/{rid}"
    assert names.topic(t) == t
    assert names.subscription(s) == s
    parsed = names.parse(t, "topics")
    assert parsed == names.ResourceName("my-project", "topics", rid)
    assert str(parsed) == t


@pytest.mark.parametrize("rid", INVALID_IDS)
def test_invalid_ids(rid: str) -> None:
    for name, check in (
        (f"projects/p/topics/{rid}", names.topic),
        (f"projects/p/subscriptions/{rid}", names.subscription),
    ):
        with pytest.raises(InvalidResourceName) as exc:
            check(name)
        assert name in str(exc.value)
        assert exc.value.name == name
        assert isinstance(exc.value, InvalidArgument)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "abc",
        "topics/abc",
        "projects/p/topics",
        "projects/p/topics/",
        "projects//topics/abc",
        "project/p/topics/abc",
        "Projects/p/topics/abc",
        "projects/p/topic/abc",
        "projects/p/subscriptions/abc",  # wrong collection
        "projects/p/topics/abc/",
        "projects/p/topics/abc/def",
        "/projects/p/topics/abc",
        "projects/p/topics/abc/subscriptions/def",
        "//projects/p/topics/abc",
    ],
)
def test_invalid_topic_shape(name: str) -> None:
    with pytest.raises(InvalidResourceName) as exc:
        names.topic(name)
    assert name in str(exc.value)


@pytest.mark.parametrize(
    "name",
    [
        "projects/p/topics/abc",  # wrong collection
        "projects/p/subscriptions",
        "projects/p/subscriptions/abc/x",
        "projects//subscriptions/abc",
    ],
)
def test_invalid_subscription_shape(name: str) -> None:
    with pytest.raises(InvalidResourceName) as exc:
        names.subscription(name)
    assert name in str(exc.value)


def test_error_message_mentions_reason() -> None:
    with pytest.raises(InvalidResourceName, match="3-255"):
        names.topic("projects/p/topics/ab")
    with pytest.raises(InvalidResourceName, match="start with a letter"):
        names.topic("projects/p/topics/1abc")
    with pytest.raises(InvalidResourceName, match="goog"):
        names.topic("projects/p/topics/googabc")
    with pytest.raises(InvalidResourceName, match="only letters"):
        names.topic("projects/p/topics/ab c")


def test_project() -> None:
    assert names.project("projects/my-project") == "my-project"
    for bad in ("", "projects/", "projects", "projects/p/topics", "project/p", "projects/a/b"):
        with pytest.raises(InvalidResourceName):
            names.project(bad)


def test_deleted_topic_marker_is_not_a_valid_topic_name() -> None:
    with pytest.raises(InvalidResourceName):
        names.topic(names.DELETED_TOPIC)
