"""Router: the control plane's assignment of topics and subscriptions to forwarders.

Given a key (a topic's or a subscription's storage uid) it returns an ordered list of forwarder
*addresses*, best first, by rendezvous (highest-random-weight) hashing: every key ranks every
forwarder, and adding or removing one moves only the keys it wins or held. It hands out
addresses, never objects (DESIGN: "the router hands out addresses"); :class:`Routes` turns an
address into the ``core.roles`` interface of that forwarder: the in-process forwarder in
``pubsubd serve``, a network stub in a cluster. ``pubsubd serve`` has one forwarder of each
kind, so every list has one element; the cluster adds members, load reports, bounded loads and
routing constraints behind this interface.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from pubsubd.core.errors import NotServedHere
from pubsubd.core.roles import PublishingForwarderApi, SubscribingForwarderApi

T = TypeVar("T")


def rank(key: str, members: Sequence[tuple[str, T]]) -> list[T]:
    """Members ordered by rendezvous weight for ``key`` (pure, deterministic)."""

    def weight(member_id: str) -> bytes:
        return hashlib.blake2b(f"{member_id}\x00{key}".encode(), digest_size=8).digest()

    return [m for _, m in sorted(members, key=lambda item: weight(item[0]), reverse=True)]


class Router:
    """Which forwarders serve a key, best first (pure: addresses in, addresses out)."""

    def __init__(self, publishing: Sequence[str], subscribing: Sequence[str]) -> None:
        if not publishing or not subscribing:
            raise ValueError("a router needs at least one forwarder of each kind")
        self.publishing = list(publishing)
        self.subscribing = list(subscribing)

    def publishing_for(self, topic_uid: str) -> list[str]:
        """Addresses of the publishing forwarders for a topic, best first."""
        if len(self.publishing) == 1:
            return list(self.publishing)
        return rank(topic_uid, [(a, a) for a in self.publishing])

    def subscribing_for(self, subscription_uid: str) -> list[str]:
        """Addresses of the subscribing forwarders for a subscription, best first."""
        if len(self.subscribing) == 1:
            return list(self.subscribing)
        return rank(subscription_uid, [(a, a) for a in self.subscribing])


class Routes:
    """The router's choices, resolved to the forwarders' interfaces by address."""

    def __init__(
        self,
        router: Router,
        publishing: Mapping[str, PublishingForwarderApi],
        subscribing: Mapping[str, SubscribingForwarderApi],
    ) -> None:
        self.router = router
        self._publishing = dict(publishing)
        self._subscribing = dict(subscribing)
        # In a cluster of forwarders, which topics this process's forwarders own (by storage
        # uid) and a subscription's topic: everything else is another forwarder's.
        self._serves: Callable[[str], bool] | None = None
        self._serves_subscription: Callable[[str], bool] | None = None
        self._topic_of: Callable[[str], str | None] = lambda _: None
        self._remote: PublishingForwarderApi | None = None

    def restrict(
        self,
        serves: Callable[[str], bool],
        topic_of: Callable[[str], str | None],
        serves_subscription: Callable[[str], bool] | None = None,
    ) -> None:
        """Serve only the topics ``serves`` says, and the subscriptions
        ``serves_subscription`` says (by default those of the topics served: ``topic_of``
        names a subscription's topic uid); asking for another one raises ``NotServedHere``."""
        self._serves = serves
        self._topic_of = topic_of
        self._serves_subscription = serves_subscription

    def serves_topic(self, topic_uid: str) -> bool:
        return self._serves is None or self._serves(topic_uid)

    def serves_subscription(self, subscription_uid: str) -> bool:
        if self._serves is None:
            return True
        if self._serves_subscription is not None:
            return self._serves_subscription(subscription_uid)
        topic_uid = self._topic_of(subscription_uid)
        return topic_uid is not None and self._serves(topic_uid)

    def publishing(self, topic_uid: str) -> PublishingForwarderApi:
        """The publishing forwarder holding a topic's publish message sources."""
        if not self.serves_topic(topic_uid):
            raise NotServedHere(f"topic storage {topic_uid}")
        return self._publishing[self.router.publishing_for(topic_uid)[0]]

    def reader(self, topic_uid: str) -> PublishingForwarderApi:
        """Where to read a topic's positions (ranges, offsets for a time): its publishing
        forwarder here, or, for a topic another forwarder owns, the copy this process keeps
        for the subscriptions it serves (``set_remote``)."""
        if self._remote is not None and not self.serves_topic(topic_uid):
            return self._remote
        return self.publishing(topic_uid)

    def set_remote(self, remote: PublishingForwarderApi) -> None:
        self._remote = remote

    def subscribing(self, subscription_uid: str) -> SubscribingForwarderApi:
        """The subscribing forwarder serving a subscription."""
        if not self.serves_subscription(subscription_uid):
            raise NotServedHere(f"subscription {subscription_uid}")
        return self._subscribing[self.router.subscribing_for(subscription_uid)[0]]

    def all_publishing(self) -> list[PublishingForwarderApi]:
        return [self._publishing[a] for a in self.router.publishing]

    def all_subscribing(self) -> list[SubscribingForwarderApi]:
        return [self._subscribing[a] for a in self.router.subscribing]
