"""A topic's storage policy from its fields and labels (core/storage_policy.py)."""

from __future__ import annotations

import pytest

from pubsubd.core import pb, storage_policy
from pubsubd.core.errors import InvalidArgument


def test_regions_become_zones_and_the_label_the_copies() -> None:
    topic = pb.Topic(name="projects/p/topics/t", labels={"pubsubd-storage-replicas": "5"})
    topic.message_storage_policy.allowed_persistence_regions.extend(["zone-a", "zone-b"])
    parsed = storage_policy.parse(topic)
    assert parsed.replicas == 5 and parsed.zones == frozenset({"zone-a", "zone-b"})
    assert (
        storage_policy.parse(pb.Topic(name="projects/p/topics/t")) == storage_policy.TopicStorage()
    )


@pytest.mark.parametrize("value", ["0", "16", "two", "-1", ""])
def test_a_bad_replica_count_is_refused(value: str) -> None:
    with pytest.raises(InvalidArgument, match="pubsubd-storage-replicas"):
        storage_policy.parse(pb.Topic(labels={"pubsubd-storage-replicas": value}))
