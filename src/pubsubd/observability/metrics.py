"""Prometheus metrics of the service, named after the domain (topics, subscriptions, forwarders)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, Info

PUBLISHED_MESSAGES = Counter("pubsubd_published_messages", "Messages acknowledged to publishers")
PUBLISHED_BYTES = Counter("pubsubd_published_bytes", "Bytes of Publish requests persisted")
DELIVERED_MESSAGES = Counter("pubsubd_delivered_messages", "Messages handed to subscribers")
ACKED_MESSAGES = Counter("pubsubd_acked_messages", "Acknowledgements applied")
OPEN_STREAMS = Gauge("pubsubd_open_streams", "StreamingPull streams open")
PUBLISH_LATENCY = Histogram(
    "pubsubd_publish_latency_seconds",
    "Time from receiving a Publish to acknowledging it (includes fsync)",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0),
)
CURSOR_LAG = Gauge(
    "pubsubd_cursor_lag_messages",
    "Replay API named cursor: messages between its committed positions and the latest ones",
    ["topic", "cursor"],
)
DEDUP_DUPLICATES = Counter(
    "pubsubd_dedup_duplicates", "PublishDeduplicated messages acknowledged as duplicates"
)
# Disk-full episodes (storage/disk_space.py): writes refused for lack of space in the data dir.
DISK_FULL = Gauge(
    "pubsubd_disk_full",
    "1 while writes to the data directory fail for lack of space (until space returns), else 0",
)
DISK_FULL_WRITES = Counter(
    "pubsubd_disk_full_writes",
    "Writes that failed for lack of disk space, by what was being written",
    ["what"],
)
DISK_FREE_BYTES = Gauge(
    "pubsubd_disk_free_bytes", "Bytes this process may still write in the data directory"
)
LOST_MESSAGES = Counter(
    "pubsubd_lost_messages",
    "Messages acknowledged without delivery because their stored bytes were damaged "
    "(topic label pubsubd-damaged-entries=skip, or `pubsubd topics skip-damaged`)",
    ["reason"],
)
DAMAGED_RANGES = Gauge(
    "pubsubd_damaged_ranges",
    "Damaged ranges of stored messages known now (reads found entries failing their checks)",
)
DAMAGED_MESSAGES = Gauge(
    "pubsubd_damaged_messages", "Messages in the damaged ranges known now (acked ones included)"
)
BACKGROUND_ERRORS = Counter(
    "pubsubd_background_errors",
    "Exceptions caught in background work (delivery pumps, timers, flush and trim loops)",
    ["task"],
)
DEAD_LETTER_FAILURES = Counter(
    "pubsubd_dead_letter_failures",
    "Dead-letter copies not published: refused by the dead-letter topic (its schema or a "
    "Publish limit), its topic missing, or unavailable. Each message stays in its subscription "
    "and is tried again after 10 s; never dropped",
    ["reason"],
)
# Storage write SLIs: the local log's group writes (fsync included when it fsyncs) and, in a
# cluster, a ledger append's time to its ack quorum of storage nodes.
STORAGE_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 2.0)
LOG_WRITE_SECONDS = Histogram(
    "pubsubd_log_write_seconds",
    "Time to write one group of entries to a local log segment (with its fsync, if any)",
    buckets=STORAGE_BUCKETS,
)
LEDGER_APPEND_SECONDS = Histogram(
    "pubsubd_ledger_append_seconds",
    "Time from sending a ledger append to its ack quorum of storage nodes answering",
    buckets=STORAGE_BUCKETS,
)
LEDGER_REPLICATION_SECONDS = Histogram(
    "pubsubd_ledger_replication_seconds",
    "Time from sending a ledger append to every node of its ledger having it (the lag of the "
    "slowest copy behind the acknowledgement)",
    buckets=STORAGE_BUCKETS,
)
LEDGER_REPLICATION_LAG = Gauge(
    "pubsubd_ledger_replication_lag_entries",
    "Entries acknowledged by a quorum but not yet on every node of their ledger, summed over "
    "the sources this process writes",
)


PROCESS = Info(
    "pubsubd_process",
    "The process behind these series: role, id (forwarder, frontend, router or storage node), "
    "zone and release. Join it to label any series by forwarder or zone: "
    "... * on(instance) group_left(id, zone) pubsubd_process_info",
)

# A subscribing forwarder's copies of other forwarders' sources (data/subscribe/remote_sources.py):
# frame bytes filled from the storage nodes' closed ledgers or over the owner's Tail.
COPY_FILL_BYTES = Counter(
    "pubsubd_copy_fill_bytes",
    "Bytes appended to read-only copies of sources owned elsewhere, by where they came from",
    ["origin"],
)


def describe_process(role: str, process_id: str, zone: str, release: str) -> None:
    """Say on /metrics what this process is (``pubsubd_process_info``)."""
    PROCESS.info({"role": role, "id": process_id, "zone": zone, "version": release})
