"""A subscription's whole backlog, put together from its forwarders' shares (pure, issue 11).

A spread subscription is served by several subscribing forwarders, each for some of its
topic's sources, and each knows the backlog of only those (the others' ack state is as of its
attach). Each forwarder's load report (``data/load_report.py``) carries a ``BacklogShare`` per
subscription it serves that has a backlog or is spread: the sources it serves, the unacked
messages and bytes in them and the age of the oldest. ``whole_backlogs`` adds the shares of
every forwarder up, so one place (``pubsubd routing show``, the router's ``/status``, the
dashboard's ``/api/cluster``) shows each subscription whole and which forwarder serves which
of its sources.

Rules:

* the whole is the sum of the shares; its oldest unacked age is the largest;
* it is *complete* when the sources reported are exactly the topic's, each by one forwarder.
  Reports are written every few seconds each, so while sources move (a spread, a gather, a
  forwarder gone) a source may be missing (the whole is then low) or reported twice (high):
  ``missing_sources`` and ``doubled_sources`` say which;
* a subscription served whole with no backlog is not reported (nothing to add up), nor is one
  beyond a report's bound (``MAX_SHARES``, the largest backlogs and every spread one first);
* only registered forwarders count: a report outlives its forwarder until its ZooKeeper
  session expires, but the router deletes the registration of one found dead within a second
  or two (``router/liveness.py``), and its sources are served elsewhere by then.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass

from pubsubd.core.publish_sources import MAX_SOURCES

__all__ = ["MAX_SHARES", "BacklogShare", "WholeBacklog", "bounded", "ranked", "whole_backlogs"]

# The shares one report carries at most (a report is one ZooKeeper znode, at most 1 MB).
MAX_SHARES = 1000


@dataclass(frozen=True, slots=True)
class BacklogShare:
    """One forwarder's share of one subscription's backlog."""

    subscription: str  # the full name
    sources: tuple[int, ...]  # the sources served there
    topic_sources: int  # how many sources the topic has, as known there
    messages: int
    bytes: int
    oldest_unacked_age_s: float
    spread: bool  # served in part, the other sources elsewhere


@dataclass(frozen=True, slots=True)
class WholeBacklog:
    """One subscription's backlog over every forwarder that reports a share of it."""

    uid: str
    subscription: str
    messages: int
    bytes: int
    oldest_unacked_age_s: float
    shares: dict[str, BacklogShare]  # forwarder ID -> its share
    as_of_unix_s: float  # the oldest report added up
    missing_sources: tuple[int, ...]
    doubled_sources: tuple[int, ...]

    @property
    def complete(self) -> bool:
        return not self.missing_sources and not self.doubled_sources

    @property
    def spread(self) -> bool:
        return any(share.spread for share in self.shares.values())

    def as_json(self) -> dict[str, object]:
        return {
            "uid": self.uid,
            "subscription": self.subscription,
            "backlog_messages": self.messages,
            "backlog_bytes": self.bytes,
            "oldest_unacked_age_s": round(self.oldest_unacked_age_s, 3),
            "spread": self.spread,
            "complete": self.complete,
            "missing_sources": list(self.missing_sources),
            "doubled_sources": list(self.doubled_sources),
            "as_of_unix_s": self.as_of_unix_s,
            "forwarders": {
                forwarder: {
                    "sources": list(share.sources),
                    "backlog_messages": share.messages,
                    "backlog_bytes": share.bytes,
                    "oldest_unacked_age_s": round(share.oldest_unacked_age_s, 3),
                }
                for forwarder, share in sorted(self.shares.items())
            },
        }


def bounded(
    shares: Mapping[str, BacklogShare], limit: int = MAX_SHARES
) -> tuple[dict[str, BacklogShare], int]:
    """The shares one report carries: every spread one and the largest backlogs first, at most
    ``limit``; and how many were left out."""
    if len(shares) <= limit:
        return dict(shares), 0
    order = sorted(shares, key=lambda uid: (not shares[uid].spread, -shares[uid].messages, uid))
    return {uid: shares[uid] for uid in order[:limit]}, len(shares) - limit


def ranked(backlogs: Iterable[WholeBacklog]) -> list[WholeBacklog]:
    """The spread subscriptions first, then by the largest backlog, then by name."""
    return sorted(backlogs, key=lambda b: (not b.spread, -b.messages, b.subscription))


def whole_backlogs(
    reports: Iterable[tuple[str, float, Mapping[str, BacklogShare]]],
    registered: Container[str] | None = None,
) -> dict[str, WholeBacklog]:
    """Subscription uid -> its whole backlog, from (forwarder ID, report time in Unix seconds,
    its shares by subscription uid) of every forwarder's last report; ``registered``: the
    forwarders registered now (others' reports are left out; None: all count)."""
    gathered: dict[str, list[tuple[str, float, BacklogShare]]] = {}
    for forwarder, at, shares in reports:
        if registered is not None and forwarder not in registered:
            continue
        for uid, share in shares.items():
            gathered.setdefault(uid, []).append((forwarder, at, share))
    out = {}
    for uid, found in gathered.items():
        seen: dict[int, int] = {}
        for _, _, share in found:
            for source in share.sources:
                seen[source] = seen.get(source, 0) + 1
        # A topic has at most MAX_SOURCES (a report saying more is not believed).
        topic_sources = min(MAX_SOURCES, max(share.topic_sources for _, _, share in found))
        newest = max(found, key=lambda f: f[1])[2]
        out[uid] = WholeBacklog(
            uid=uid,
            subscription=newest.subscription,
            messages=sum(share.messages for _, _, share in found),
            bytes=sum(share.bytes for _, _, share in found),
            oldest_unacked_age_s=max(share.oldest_unacked_age_s for _, _, share in found),
            shares={forwarder: share for forwarder, _, share in found},
            as_of_unix_s=min(at for _, at, _ in found),
            missing_sources=tuple(s for s in range(topic_sources) if s not in seen),
            doubled_sources=tuple(sorted(s for s, n in seen.items() if n > 1)),
        )
    return out
