"""A subscription's view of its topic's publish message sources, for the delivery planner.

Implements ``planner.SourceReader`` over the publishing forwarder's interface
(``core.roles.PublishingForwarderApi``): reads go through its narrow read calls, and entries are
decoded here, on the subscribing side, through a cache shared by every subscription of the
topic that this subscribing forwarder serves (``data/decoding.py``).
"""

from __future__ import annotations

from pubsubd.core.damage_policy import DamagePolicy
from pubsubd.core.records import Entry
from pubsubd.core.roles import PublishingForwarderApi
from pubsubd.data.decoding import DecodeCache, DecodedEntry


class TopicReader:
    """Reads one topic's sources for the subscriptions of one subscribing forwarder."""

    __slots__ = ("cache", "publishing", "topic_uid")

    def __init__(
        self, publishing: PublishingForwarderApi, topic_uid: str, cache: DecodeCache
    ) -> None:
        self.publishing = publishing
        self.topic_uid = topic_uid
        self.cache = cache

    def source_count(self) -> int:
        return self.publishing.source_count(self.topic_uid)

    def start_offset(self, source: int) -> int:
        return self.publishing.start_offset(self.topic_uid, source)

    def committed_offset(self, source: int) -> int:
        return self.publishing.committed_offset(self.topic_uid, source)

    def read(self, source: int, offset: int, max_entries: int) -> list[Entry]:
        return self.publishing.read(self.topic_uid, source, offset, max_entries, 4 << 20)

    def entry_at(self, source: int, offset: int) -> Entry:
        return self.publishing.entry_at(self.topic_uid, source, offset)

    def decoded(self, source: int, entry: Entry) -> DecodedEntry:
        return self.cache.decoded(source, entry)

    def damage_policy(self) -> DamagePolicy:
        return self.publishing.damage_policy(self.topic_uid)

    def delay_due(self, at_us: int, position: int) -> bool:
        return self.publishing.delay_due(self.topic_uid, at_us, position)

    def publish_time_us(self, position_source: int, offset: int) -> int:
        return self.publishing.publish_time_us(self.topic_uid, position_source, offset)
