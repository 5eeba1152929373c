"""Which publish message source of a topic a publish goes to (pure).

* With an ordering key: the source the key ranks first by rendezvous (highest-random-weight)
  hashing among sources ``0 .. key_sources - 1``. ``key_sources`` is fixed when the topic is
  created (``control/publish_sources.py``), so a key maps to the same source for the topic's
  whole life, however many sources are added: every message of a key is in one log, in publish
  order, and the dispatcher's per-key ordering holds without looking across sources.
* Without one: over every *active* source (all of them unless the topic's
  ``pubsubd-active-publish-sources`` label says fewer: ``core/source_growth.py`` lowers it for a
  quiet topic), balanced by message count (``Balancer``: round-robin for one-message publishes),
  so added sources share the load at once.

Every message of a PublishRequest has the same ordering key (``core.validation.publish_request``
refuses mixed keys), so one request is one log entry in one source.
"""

from __future__ import annotations

import functools
import hashlib


@functools.lru_cache(maxsize=8192)  # hot keys; at most 8 MB of 1 KB keys
def key_source(key: str, key_sources: int) -> int:
    """The source of ordering key ``key`` among ``key_sources`` sources (deterministic)."""
    if key_sources <= 1:
        return 0
    best, best_weight = 0, b""
    for source in range(key_sources):
        weight = hashlib.blake2b(f"{source}\x00{key}".encode(), digest_size=8).digest()
        if weight > best_weight:
            best, best_weight = source, weight
    return best


class Balancer:
    """Where unkeyed publishes go: the source that has taken the fewest unkeyed messages (ties:
    the lowest), so batches of any size spread evenly and one-message publishes go round-robin.
    The counts differ by at most one batch; when the number of sources changes, every source
    starts level (none owes the others the messages it missed while it took none)."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: list[int] = []

    def take(self, source_count: int, count: int) -> int:
        counts = self._counts
        if len(counts) != source_count:
            counts = self._counts = [0] * source_count
        source = min(range(source_count), key=counts.__getitem__)
        counts[source] += count
        return source


def route(
    ordering_key: str,
    key_sources: int,
    source_count: int,
    rr: Balancer,
    count: int,
    active: int = 0,
) -> int:
    """The source a publish of ``count`` messages goes to (see the module docstring);
    ``active``: the sources unkeyed publishes go to (0: all ``source_count``)."""
    if source_count <= 1:
        return 0
    if ordering_key:
        return key_source(ordering_key, min(key_sources, source_count))
    serving = min(active, source_count) if active > 0 else source_count
    return 0 if serving <= 1 else rr.take(serving, count)
