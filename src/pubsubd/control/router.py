"""Router: the control plane's assignment of topics and subscriptions to forwarders.

Given a key (a topic's or subscription's storage identity) it returns an ordered list of
forwarders, best first, by rendezvous (highest-random-weight) hashing: every key ranks every
forwarder, adding or removing one forwarder moves only the keys it wins or held. ``pubsubd serve``
has one publishing and one subscribing forwarder, so every list has one element; the multi-machine
deployment adds members, load reports, bounded loads and routing constraints behind this interface.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TypeVar

from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.data.subscribe.forwarder import SubscribingForwarder

T = TypeVar("T")


def rank(key: str, members: Sequence[tuple[str, T]]) -> list[T]:
    """Members ordered by rendezvous weight for ``key`` (pure, deterministic)."""

    def weight(member_id: str) -> bytes:
        return hashlib.blake2b(f"{member_id}\x00{key}".encode(), digest_size=8).digest()

    return [m for _, m in sorted(members, key=lambda item: weight(item[0]), reverse=True)]


class Router:
    def __init__(
        self,
        publishing: Sequence[tuple[str, PublishingForwarder]],
        subscribing: Sequence[tuple[str, SubscribingForwarder]],
    ) -> None:
        if not publishing or not subscribing:
            raise ValueError("a router needs at least one forwarder of each kind")
        self.publishing = list(publishing)
        self.subscribing = list(subscribing)

    def publishing_forwarder(self, topic_uid: str) -> PublishingForwarder:
        if len(self.publishing) == 1:
            return self.publishing[0][1]
        return rank(topic_uid, self.publishing)[0]

    def subscribing_forwarder(self, subscription_uid: str) -> SubscribingForwarder:
        if len(self.subscribing) == 1:
            return self.subscribing[0][1]
        return rank(subscription_uid, self.subscribing)[0]
