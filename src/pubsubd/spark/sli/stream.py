"""``pubsubd sli-report --follow``: the SLI job as a Spark streaming query.

The query reads ``projects/_pubsubd/topics/sli-events`` through the ``pubsubd`` connector
(starting from the earliest retained event, or ``--since``), checkpointed under
``OUT/_checkpoint``. Each micro-batch (``foreachBatch``) first stores its parsed events as
``OUT/events/batch=N`` (overwritten, not appended: a batch replayed after a crash or a stop
rewrites the same directory, so no event is counted twice), then rebuilds every table and the
HTML report from the stored events with :func:`pubsubd.spark.sli.jobs.refresh`. A restart
resumes from the checkpoint and reads only the events published since.

The cost of a refresh grows with the stored events (every table is recomputed; an incremental
per-date refresh is not built). The query stops on SIGTERM or SIGINT, or after ``max_batches``
micro-batches that held events, between two micro-batches (checked every second; a refresh is
never interrupted, and a batch that begins once the stop is asked for fails and is replayed by
the next run), or, with ``available_now``, once every event published before the start is in.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from pubsubd.observability.events import EVENTS_TOPIC
from pubsubd.spark.sli.jobs import Result, parse_events, refresh
from pubsubd.spark.sli.slo import SloConfig, load_slo

EVENTS_DIR = "events"
CHECKPOINT_DIR = "_checkpoint"


@dataclass
class Progress:
    """What a ``--follow`` run did (filled in by the micro-batches, read by the caller)."""

    batches: int = 0  # micro-batches that held events
    events: int = 0  # events stored by this run
    last: Result | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_batch: bool = False  # a micro-batch is being stored or refreshed (never interrupted)


class StopRequested(Exception):
    """Raised in a micro-batch that begins after a stop was asked for (it is replayed later)."""


def stored_events(spark: Any, out: Path) -> Any:
    """Every event stored by ``--follow`` runs (the ``batch`` column is the micro-batch id)."""
    return spark.read.parquet(str(out / EVENTS_DIR))


def start(
    spark: Any,
    endpoint: str,
    out: Path,
    slo: SloConfig,
    progress: Progress,
    since: str | None = None,
    available_now: bool = False,
    interval: str = "10 seconds",
    max_batches: int | None = None,
    topic: str = EVENTS_TOPIC,
) -> Any:
    """Start the streaming query; returns it (a ``StreamingQuery``)."""
    out.mkdir(parents=True, exist_ok=True)
    reader = (
        spark.readStream.format("pubsubd")
        .option("endpoint", endpoint)
        .option("topic", topic)
        .option("startingOffsets", "earliest")  # only read without a checkpoint
    )
    if since:
        reader = reader.option("startingTimestamp", since)
    events = parse_events(reader.load())

    def each_batch(batch: Any, batch_id: int) -> None:
        with progress.lock:
            if progress.stop.is_set():  # stopping: fail the batch, the next run replays it
                raise StopRequested(f"micro-batch {batch_id} left to the next run")
            progress.in_batch = True
        try:
            store_and_refresh(batch, batch_id)
        finally:
            with progress.lock:
                progress.in_batch = False

    def store_and_refresh(batch: Any, batch_id: int) -> None:
        # Never skip a batch handed over here: Spark marks it done once this returns.
        batch = batch.persist()  # read from the server once
        try:
            n = batch.count()
            if n == 0:
                return  # an empty micro-batch: nothing new to report
            # The directory names the partition column ``batch``; overwriting it makes a
            # replayed batch idempotent.
            batch.write.mode("overwrite").parquet(str(out / EVENTS_DIR / f"batch={batch_id}"))
        finally:
            batch.unpersist()
        progress.events += n
        progress.batches += 1
        progress.last = refresh(spark, stored_events(spark, out), out, slo, endpoint)
        if max_batches is not None and progress.batches >= max_batches:
            progress.stop.set()

    writer = (
        events.writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", str(out / CHECKPOINT_DIR))
        .queryName("pubsubd-sli-report")
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=interval)
    )
    return writer.start()


@contextlib.contextmanager
def _stop_on_signals(progress: Progress) -> Iterator[None]:
    """SIGTERM and SIGINT set ``progress.stop`` while the query runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        progress.stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def follow(
    spark: Any,
    endpoint: str,
    out: Path,
    slo: SloConfig | None = None,
    since: str | None = None,
    available_now: bool = False,
    interval: str = "10 seconds",
    max_batches: int | None = None,
    topic: str = EVENTS_TOPIC,
) -> Progress:
    """Run the streaming query until it ends (``available_now``), ``max_batches`` batches are
    done, or a signal stops it; the stop is clean (the checkpoint stays consistent)."""
    progress = Progress()
    query = start(
        spark,
        endpoint,
        out,
        slo or load_slo(None),
        progress,
        since,
        available_now,
        interval,
        max_batches,
        topic,
    )
    with _stop_on_signals(progress):
        try:
            while query.isActive:
                query.awaitTermination(1)
                if progress.stop.is_set():
                    with progress.lock:  # not in the middle of a batch's Spark jobs
                        if not progress.in_batch:
                            break
        finally:
            progress.stop.set()
            if query.isActive:
                query.stop()
    exc = query.exception()
    if exc is not None and "StopRequested" not in str(exc):
        raise RuntimeError(f"the SLI streaming query failed: {exc}")
    return progress


def follow_main(
    endpoint: str,
    out: Path,
    slo_file: Path | None,
    since: str | None,
    available_now: bool,
    interval: str,
    max_batches: int | None,
) -> Progress:
    """Entry point of ``pubsubd sli-report --follow``."""
    from pubsubd.spark.sli.jobs import spark_session

    return follow(
        spark_session(),
        endpoint,
        out,
        load_slo(slo_file),
        since,
        available_now,
        interval,
        max_batches,
    )
