"""A forwarder's subscriptions brought to the published assignment (data/ownership.py).

A subscription is served here under its name, and named by its uid in the assignment. A name
deleted and created again has a new uid, and the routes of the two uids live in different
shards of the assignment, which arrive in any order: the new uid can be gained here before
the old one is seen to go. Letting the old uid go must not end the new one's service.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from pubsubd.core import pb
from pubsubd.core.errors import SubscriptionNotFound
from pubsubd.data.ownership import SubscriptionOwnership
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.data.reconcile import SubscribingReconciler
from pubsubd.data.subscribe.forwarder import SubscribingForwarder
from pubsubd.data.subscribe.remote_sources import RemoteSources
from pubsubd.storage.log import FsyncPolicy
from pubsubd.storage.metadata import Change, SubscriptionRecord

TOPIC_UID = "topic-uid"
NAME = "projects/p/subscriptions/reused"


def _record(uid: str) -> SubscriptionRecord:
    body = pb.Subscription(name=NAME, topic="projects/p/topics/t", ack_deadline_seconds=10)
    return SubscriptionRecord(NAME, uid, TOPIC_UID, body.SerializeToString(), {0: 0})


@pytest.fixture
async def forwarders(tmp_path: Path) -> AsyncIterator[tuple[SubscribingForwarder, Path]]:
    """A subscribing forwarder reading a one-source topic of a publishing forwarder here."""
    publishing = PublishingForwarder(tmp_path / "data", fsync=FsyncPolicy.NEVER)
    publishing.configure_topic(TOPIC_UID, 1, 1)
    subscribing = SubscribingForwarder(lambda _uid: publishing)
    try:
        yield subscribing, tmp_path
    finally:
        await subscribing.close()
        await publishing.close()


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached in 2 s")


async def test_the_old_uid_let_go_after_the_new_one_came_leaves_the_new_one_served(
    forwarders: tuple[SubscribingForwarder, Path],
) -> None:
    subscribing, tmp_path = forwarders
    records: dict[str, SubscriptionRecord] = {}
    assigned: set[str] = set()
    ready: set[str] = set()
    reconciler = SubscribingReconciler(subscribing, owns=lambda r: r.uid in ready)
    remote = RemoteSources(tmp_path / "copies", lambda _uid: [])
    ownership = SubscriptionOwnership(
        assigned=lambda: set(assigned),
        topic_assigned=lambda uid: uid == TOPIC_UID,
        record_of=records.get,
        subscribing=subscribing,
        subscribing_reconciler=reconciler,
        owned_topics={TOPIC_UID},
        remote=remote,
        ready=ready,
    )
    try:
        records["old"] = _record("old")
        assigned.add("old")
        ownership.changed()
        await _until(lambda: subscribing.serves(NAME))
        assert subscribing.dispatcher(NAME).uid == "old"

        # Deleted and created again under the same name (the catalog's changes, in order).
        reconciler(Change(records.pop("old"), deleted=True))
        assert not subscribing.serves(NAME)
        records["new"] = _record("new")
        reconciler(Change(records["new"]))  # not served here yet: nothing opens

        # The new uid's shard arrives first ...
        assigned.add("new")
        ownership.changed()
        await _until(lambda: "new" in ready)
        assert subscribing.dispatcher(NAME).uid == "new"
        # ... then the old uid's removal.
        assigned.discard("old")
        ownership.changed()
        await _until(lambda: ownership.released == 1)
        assert subscribing.dispatcher(NAME).uid == "new", "the new subscription still served"

        # Deleting it for good ends its service.
        reconciler(Change(records.pop("new"), deleted=True))
        try:
            subscribing.dispatcher(NAME)
        except SubscriptionNotFound:
            pass
        else:
            raise AssertionError("a deleted subscription is not served")
    finally:
        await ownership.close()
        await remote.close()


async def test_a_record_of_the_name_under_a_new_uid_replaces_the_one_served(
    forwarders: tuple[SubscribingForwarder, Path],
) -> None:
    subscribing, _ = forwarders
    reconciler = SubscribingReconciler(subscribing, owns=lambda _r: True)
    reconciler(Change(_record("old")))
    assert subscribing.served_uid(NAME) == "old"
    reconciler(Change(_record("new")))  # the old one's deletion was not seen here
    assert subscribing.served_uid(NAME) == "new"
    reconciler(Change(_record("old"), deleted=True))  # seen late: changes nothing
    assert subscribing.served_uid(NAME) == "new"
    reconciler(Change(_record("new"), deleted=True))
    assert subscribing.served_uid(NAME) is None
