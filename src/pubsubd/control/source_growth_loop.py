"""Source growth at work: every few seconds, the publishing load of each topic this process
owns, and an UpdateTopic for each one whose active sources should change
(``core/source_growth.py`` decides; the catalog applies it with the same rules as a client's
UpdateTopic, so the change is durable in the metadata store first and every forwarder follows
it from there, ``data/reconcile.py``).

Only the topic's owner (the forwarder that writes its publish message sources, and counts its
publishes) decides for it; with ``serve``, that is every topic. Off unless a source's capacity
is configured (``--source-capacity``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from google.protobuf import field_mask_pb2

from pubsubd.control.catalog import Catalog
from pubsubd.core import pb, publish_sources
from pubsubd.core.errors import PubsubError
from pubsubd.core.load import Counters, Rates
from pubsubd.core.source_growth import GrowthSettings, SourceGrowth
from pubsubd.observability import background

log = logging.getLogger(__name__)

__all__ = ["SourceGrowthLoop"]

# The load's EWMA follows a change within a few samples: its half-life, in samples.
HALF_LIFE_SAMPLES = 2.0

# topic uid -> [messages, bytes] published while held here (PublishingForwarder.published)
Published = Callable[[], Mapping[str, Sequence[int]]]


class SourceGrowthLoop:
    """Samples the owned topics' publish counters and applies :class:`SourceGrowth`."""

    def __init__(
        self,
        settings: GrowthSettings,
        catalog: Catalog,
        published: Published,
        owns: Callable[[str], bool] | None = None,
    ) -> None:
        self.growth = SourceGrowth(settings)
        self.catalog = catalog
        self.published = published
        self.owns = owns
        self.interval_s = settings.sample_interval_s
        self.rates = Rates(HALF_LIFE_SAMPLES * settings.sample_interval_s)
        self.changes = 0  # UpdateTopics made
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="source growth")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.step(time.monotonic())
            except Exception as exc:
                background.report("source growth", exc)

    def step(self, now: float) -> None:
        """One sample of every owned topic, and the changes it calls for."""
        counters = {
            uid: Counters(counts[0], counts[1], 0)
            for uid, counts in self.published().items()
            if self.owns is None or self.owns(uid)
        }
        self.rates.sample(now, counters)
        for gone in self.growth.topics() - counters.keys():
            self.growth.forget(gone)
        for uid, load in self.rates.loads().items():
            entry = self.catalog.topics_by_uid.get(uid)
            if entry is None:
                self.growth.forget(uid)
                continue
            labels = entry.topic.labels
            counts = publish_sources.parse(labels)
            active = self.growth.decide(uid, load, counts, now)
            if active is None or active == counts.serving:
                continue
            self._apply(entry.topic, counts, active, load.messages_per_s)

    def _apply(
        self, topic: object, counts: publish_sources.SourceCounts, active: int, rate: float
    ) -> None:
        current = pb.Topic()
        current.CopyFrom(topic)
        update = pb.Topic(name=current.name)
        update.labels.update(current.labels)
        if active > counts.sources:
            update.labels[publish_sources.SOURCES_LABEL] = str(active)
        update.labels[publish_sources.ACTIVE_SOURCES_LABEL] = str(active)
        try:
            self.catalog.update_topic(update, field_mask_pb2.FieldMask(paths=["labels"]))
        except PubsubError as e:  # deleted meanwhile, or a label a client set since
            log.warning("topic %s: source growth to %d not applied: %s", current.name, active, e)
            return
        self.changes += 1
        log.info(
            "topic %s: %d active publish message sources (were %d; %.0f messages/s)",
            current.name,
            active,
            counts.serving,
            rate,
        )
