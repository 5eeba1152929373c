"""Topic and subscription administration with the official client (docs/GOOGLE_API.md §3-§6)."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.protobuf import duration_pb2, field_mask_pb2

from tests.conftest import PROJECT, make_subscriber
from tests.support.server import ServerProcess, wait_for
from tests.support.status import sub_status

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:The return_immediately flag is deprecated"),
]

SEVEN_DAYS_S = 7 * 24 * 3600


def _mask(*paths: str) -> field_mask_pb2.FieldMask:
    return field_mask_pb2.FieldMask(paths=list(paths))


def _pull_now(sub: pubsub_v1.SubscriberClient, name: str, n: int = 100) -> list[Any]:
    resp = sub.pull(
        request={"subscription": name, "max_messages": n, "return_immediately": True}, timeout=10
    )
    return list(resp.received_messages)


# --- topics -----------------------------------------------------------------------------------


def test_create_topic_is_active_and_gettable(clients: Any, names: Any) -> None:
    pub, _ = clients
    name = names.topic()
    created = pub.create_topic(request={"name": name, "labels": {"env": "test"}})
    assert created.name == name
    assert created.state == pubsub_v1.types.Topic.State.ACTIVE
    assert dict(created.labels) == {"env": "test"}
    got = pub.get_topic(topic=name)
    assert got.name == name
    assert got.state == pubsub_v1.types.Topic.State.ACTIVE
    assert dict(got.labels) == {"env": "test"}


def test_duplicate_topic_already_exists(clients: Any, names: Any) -> None:
    pub, _ = clients
    name = names.topic()
    pub.create_topic(name=name)
    with pytest.raises(exceptions.AlreadyExists) as e:
        pub.create_topic(name=name)
    assert name in e.value.message


def test_missing_topic_not_found(clients: Any, names: Any) -> None:
    pub, _ = clients
    name = names.topic("missing")
    with pytest.raises(exceptions.NotFound):
        pub.get_topic(topic=name)
    with pytest.raises(exceptions.NotFound):
        pub.delete_topic(topic=name)
    with pytest.raises(exceptions.NotFound):
        pub.update_topic(
            request={"topic": {"name": name, "labels": {"a": "b"}}, "update_mask": _mask("labels")}
        )
    with pytest.raises(exceptions.NotFound):
        list(pub.list_topic_subscriptions(topic=name))


def test_update_topic_labels_and_retention(clients: Any, names: Any) -> None:
    pub, _ = clients
    name = names.topic()
    pub.create_topic(request={"name": name, "labels": {"old": "1"}})
    updated = pub.update_topic(
        request={
            "topic": {"name": name, "labels": {"new": "2"}},
            "update_mask": _mask("labels"),
        }
    )
    assert dict(updated.labels) == {"new": "2"}
    updated = pub.update_topic(
        request={
            "topic": {
                "name": name,
                "message_retention_duration": duration_pb2.Duration(seconds=3600),
            },
            "update_mask": _mask("message_retention_duration"),
        }
    )
    assert updated.message_retention_duration.total_seconds() == 3600
    assert dict(updated.labels) == {"new": "2"}, "fields outside the mask are kept"
    got = pub.get_topic(topic=name)
    assert got.message_retention_duration.total_seconds() == 3600
    assert dict(got.labels) == {"new": "2"}
    # A masked field left unset in the request is cleared.
    cleared = pub.update_topic(request={"topic": {"name": name}, "update_mask": _mask("labels")})
    assert dict(cleared.labels) == {}
    assert cleared.message_retention_duration.total_seconds() == 3600


def test_update_topic_retention_out_of_range(clients: Any, names: Any) -> None:
    pub, _ = clients
    name = names.topic()
    pub.create_topic(name=name)
    with pytest.raises(exceptions.InvalidArgument):
        pub.update_topic(
            request={
                "topic": {"name": name, "message_retention_duration": {"seconds": 60}},
                "update_mask": _mask("message_retention_duration"),
            }
        )


@pytest.mark.parametrize(
    "paths",
    [
        pytest.param([], id="empty"),
        pytest.param(["no_such_field"], id="unknown"),
        pytest.param(["name"], id="name-not-updatable"),
        pytest.param(["messageRetentionDuration"], id="camel-case"),
    ],
)
def test_update_topic_bad_mask_invalid_argument(clients: Any, names: Any, paths: list[str]) -> None:
    pub, _ = clients
    name = names.topic()
    pub.create_topic(name=name)
    with pytest.raises(exceptions.InvalidArgument):
        pub.update_topic(
            request={"topic": {"name": name, "labels": {"a": "b"}}, "update_mask": _mask(*paths)}
        )


def test_update_topic_mask_subpath_of_map_is_invalid_argument(clients: Any, names: Any) -> None:
    """A mask path below a map field ("labels.a") is a client error, not INTERNAL."""
    pub, _ = clients
    name = names.topic()
    pub.create_topic(name=name)
    with pytest.raises(exceptions.InvalidArgument):
        pub.update_topic(
            request={
                "topic": {"name": name, "labels": {"a": "b"}},
                "update_mask": _mask("labels.a"),
            }
        )


def test_update_subscription_mask_subpath_is_invalid_argument(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic = names.topic()
    pub.create_topic(name=topic)
    sub.create_subscription(name=names.subscription(), topic=topic)
    with pytest.raises(exceptions.InvalidArgument):
        sub.update_subscription(
            request={
                "subscription": {"name": names.subscription(), "labels": {"a": "b"}},
                "update_mask": _mask("labels.a"),
            }
        )


def test_list_topics_pages(clients: Any, names: Any) -> None:
    pub, _ = clients
    mine = {names.topic(f"page{i}") for i in range(5)}
    for name in mine:
        pub.create_topic(name=name)
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        resp = pub.list_topics(
            request={"project": f"projects/{PROJECT}", "page_size": 2, "page_token": token}
        ).pages
        page = next(iter(resp))
        pages += 1
        assert len(page.topics) <= 2
        if page.next_page_token:
            assert len(page.topics) == 2, "only the last page may be short"
        seen.extend(t.name for t in page.topics if t.name.endswith(names.suffix))
        token = page.next_page_token
        if not token:
            break
        assert pages < 10_000
    assert sorted(seen) == sorted(mine), "every topic exactly once across pages"


def test_list_topics_exact_pages_in_own_project(clients: Any) -> None:
    pub, _ = clients
    project = f"pages-{uuid.uuid4().hex[:8]}"
    created = sorted(f"projects/{project}/topics/t{i}-x" for i in range(5))
    for name in created:
        pub.create_topic(name=name)
    page_iter = pub.list_topics(request={"project": f"projects/{project}", "page_size": 2}).pages
    pages = [[t.name for t in page.topics] for page in page_iter]
    assert [len(p) for p in pages] == [2, 2, 1]
    assert sorted(n for p in pages for n in p) == created
    # A token from another listing, or garbage, is rejected.
    with pytest.raises(exceptions.InvalidArgument):
        next(
            iter(
                pub.list_topics(
                    request={"project": f"projects/{project}", "page_token": "!!not-a-token!!"}
                ).pages
            )
        )


def test_list_topic_subscriptions(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic = names.topic()
    other = names.topic("other")
    pub.create_topic(name=topic)
    pub.create_topic(name=other)
    subs = {names.subscription(f"s{i}") for i in range(3)}
    for s in subs:
        sub.create_subscription(name=s, topic=topic)
    sub.create_subscription(name=names.subscription("elsewhere"), topic=other)
    assert set(pub.list_topic_subscriptions(topic=topic)) == subs
    paged = pub.list_topic_subscriptions(request={"topic": topic, "page_size": 2}).pages
    assert [len(p.subscriptions) for p in paged] == [2, 1]
    assert list(pub.list_topic_subscriptions(topic=other)) == [names.subscription("elsewhere")]


def test_delete_topic_keeps_subscriptions_as_deleted_topic(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic = names.topic()
    sname = names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(name=sname, topic=topic)
    pub.delete_topic(topic=topic)
    with pytest.raises(exceptions.NotFound):
        pub.get_topic(topic=topic)
    assert sub.get_subscription(subscription=sname).topic == "_deleted-topic_"
    listed = [s for s in sub.list_subscriptions(project=f"projects/{PROJECT}") if s.name == sname]
    assert [s.topic for s in listed] == ["_deleted-topic_"]
    # Publishing to the deleted name fails at once with NOT_FOUND.
    with pytest.raises(exceptions.NotFound):
        pub.publish(topic, b"x").result(timeout=30)
    # Re-created under the same name: a new topic, with no subscriptions.
    pub.create_topic(name=topic)
    assert list(pub.list_topic_subscriptions(topic=topic)) == []
    pub.publish(topic, b"after").result(timeout=30)
    assert sub.get_subscription(subscription=sname).topic == "_deleted-topic_"
    assert _pull_now(sub, sname) == [], "the old subscription does not read the new topic"


# --- subscriptions ----------------------------------------------------------------------------


def test_create_subscription_fills_defaults(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic = names.topic()
    pub.create_topic(name=topic)
    created = sub.create_subscription(
        request={"name": names.subscription(), "topic": topic, "ack_deadline_seconds": 0}
    )
    assert created.topic == topic
    assert created.ack_deadline_seconds == 10
    assert created.message_retention_duration.total_seconds() == SEVEN_DAYS_S
    assert created.state == pubsub_v1.types.Subscription.State.ACTIVE
    got = sub.get_subscription(subscription=names.subscription())
    assert got.ack_deadline_seconds == 10
    assert got.message_retention_duration.total_seconds() == SEVEN_DAYS_S
    # Explicit values are kept.
    custom = sub.create_subscription(
        request={
            "name": names.subscription("custom"),
            "topic": topic,
            "ack_deadline_seconds": 42,
            "message_retention_duration": {"seconds": 3600},
            "labels": {"team": "a"},
        }
    )
    assert custom.ack_deadline_seconds == 42
    assert custom.message_retention_duration.total_seconds() == 3600
    assert dict(custom.labels) == {"team": "a"}


def test_duplicate_subscription_already_exists(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic = names.topic()
    pub.create_topic(name=topic)
    sub.create_subscription(name=names.subscription(), topic=topic)
    with pytest.raises(exceptions.AlreadyExists):
        sub.create_subscription(name=names.subscription(), topic=topic)


def test_subscription_to_missing_topic_not_found(clients: Any, names: Any) -> None:
    _, sub = clients
    with pytest.raises(exceptions.NotFound):
        sub.create_subscription(name=names.subscription(), topic=names.topic("missing"))
    with pytest.raises(exceptions.NotFound):
        sub.get_subscription(subscription=names.subscription())


def test_update_subscription(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic = names.topic()
    sname = names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(name=sname, topic=topic)
    updated = sub.update_subscription(
        request={
            "subscription": {"name": sname, "ack_deadline_seconds": 77, "labels": {"k": "v"}},
            "update_mask": _mask("ack_deadline_seconds", "labels"),
        }
    )
    assert updated.ack_deadline_seconds == 77
    assert dict(updated.labels) == {"k": "v"}
    assert updated.topic == topic
    got = sub.get_subscription(subscription=sname)
    assert got.ack_deadline_seconds == 77
    assert dict(got.labels) == {"k": "v"}
    with pytest.raises(exceptions.InvalidArgument):
        sub.update_subscription(
            request={"subscription": {"name": sname, "labels": {}}, "update_mask": _mask()}
        )
    with pytest.raises(exceptions.InvalidArgument):
        sub.update_subscription(
            request={
                "subscription": {"name": sname, "topic": names.topic("other")},
                "update_mask": _mask("topic"),
            }
        )
    with pytest.raises(exceptions.InvalidArgument):
        sub.update_subscription(
            request={
                "subscription": {"name": sname, "ack_deadline_seconds": 601},
                "update_mask": _mask("ack_deadline_seconds"),
            }
        )
    with pytest.raises(exceptions.NotFound):
        sub.update_subscription(
            request={
                "subscription": {"name": names.subscription("missing"), "labels": {"a": "b"}},
                "update_mask": _mask("labels"),
            }
        )
    assert sub.get_subscription(subscription=sname).ack_deadline_seconds == 77


def test_list_subscriptions_pages(clients: Any, names: Any) -> None:
    pub, sub = clients
    project = f"subpages-{uuid.uuid4().hex[:8]}"
    topic = f"projects/{project}/topics/topic-x"
    pub.create_topic(name=topic)
    created = sorted(f"projects/{project}/subscriptions/s{i}-x" for i in range(5))
    for s in created:
        sub.create_subscription(name=s, topic=topic)
    pages = [
        [s.name for s in page.subscriptions]
        for page in sub.list_subscriptions(
            request={"project": f"projects/{project}", "page_size": 2}
        ).pages
    ]
    assert [len(p) for p in pages] == [2, 2, 1]
    assert sorted(n for p in pages for n in p) == created
    full = list(sub.list_subscriptions(project=f"projects/{project}"))
    assert all(s.topic == topic and s.ack_deadline_seconds == 10 for s in full)
    # Counted by suffix in the shared project too.
    mine = {names.subscription(f"l{i}") for i in range(3)}
    shared_topic = names.topic()
    pub.create_topic(name=shared_topic)
    for s in mine:
        sub.create_subscription(name=s, topic=shared_topic)
    listed = [
        s.name
        for s in sub.list_subscriptions(request={"project": f"projects/{PROJECT}", "page_size": 2})
        if s.name.endswith(names.suffix)
    ]
    assert sorted(listed) == sorted(mine)


def _pull_not_found(sub: Any, sname: str) -> bool:
    try:
        sub.pull(request={"subscription": sname, "max_messages": 1, "return_immediately": True})
    except exceptions.NotFound:
        return True
    return False


def test_delete_subscription_then_pull_not_found(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic = names.topic()
    sname = names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(name=sname, topic=topic)
    sub.delete_subscription(subscription=sname)
    # At once in every deployment: behind a frontend the delete may go to a forwarder that
    # does not serve the subscription (not routed yet), which answers only once the serving
    # one applied it (api/grpc/serving_catch_up.py).
    assert _pull_not_found(sub, sname)
    with pytest.raises(exceptions.NotFound):
        sub.get_subscription(subscription=sname)
    with pytest.raises(exceptions.NotFound):
        sub.delete_subscription(subscription=sname)
    assert sname not in set(pub.list_topic_subscriptions(topic=topic))


def test_subscription_name_reuse_is_fresh(clients: Any, names: Any) -> None:
    pub, sub = clients
    topic = names.topic()
    sname = names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(name=sname, topic=topic)
    for i in range(5):
        pub.publish(topic, f"old-{i}".encode())
    pub.publish(topic, b"old-last").result(timeout=30)
    got: list[Any] = []
    wait_for(lambda: got.extend(_pull_now(sub, sname)) or len(got) >= 6, 10, "the old backlog")
    old_ack_id = got[0].ack_id
    sub.delete_subscription(subscription=sname)
    sub.create_subscription(name=sname, topic=topic)
    assert _pull_now(sub, sname) == [], "no old backlog in the new subscription"
    # An ack ID of the deleted incarnation does not act on the new one.
    with pytest.raises(exceptions.InvalidArgument):
        sub.acknowledge(subscription=sname, ack_ids=[old_ack_id])
    pub.publish(topic, b"new").result(timeout=30)
    fresh: list[Any] = []
    wait_for(lambda: fresh.extend(_pull_now(sub, sname)) or fresh, 10, "the new message")
    assert [m.message.data for m in fresh] == [b"new"]


def test_delete_subscription_ends_subscribe_with_not_found(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    pub, sub = clients
    topic = names.topic()
    sname = names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(name=sname, topic=topic)
    streaming = make_subscriber(shared_server.endpoint)
    future = streaming.subscribe(sname, lambda m: m.ack())
    try:
        wait_for(
            lambda: sub_status(shared_server, sname).get("consumers") == 1,
            15,
            "the stream to open",
        )
        sub.delete_subscription(subscription=sname)
        with pytest.raises(exceptions.NotFound):
            future.result(timeout=15)
    finally:
        future.cancel()
        streaming.close()


def test_delete_subscription_answers_waiting_pull_with_not_found(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    pub, sub = clients
    topic = names.topic()
    sname = names.subscription()
    pub.create_topic(name=topic)
    sub.create_subscription(name=sname, topic=topic)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(sub.pull, request={"subscription": sname, "max_messages": 1})
        wait_for(lambda: sub_status(shared_server, sname).get("consumers") == 1, 10, "the Pull")
        start = time.monotonic()
        sub.delete_subscription(subscription=sname)
        with pytest.raises(exceptions.NotFound):
            waiting.result(timeout=10)
        assert time.monotonic() - start < 5
