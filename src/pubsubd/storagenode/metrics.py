"""Prometheus metrics of a storage node (``pubsubd storage``), named ``pubsubd_storage_*``."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

APPENDS = Counter(
    "pubsubd_storage_appends",
    "Append calls answered, by result (ok, retry, fenced, gap, mismatch, invalid, unavailable,"
    " disk_full)",
    ["result"],
)
APPENDED_BYTES = Counter("pubsubd_storage_appended_bytes", "Frame bytes made durable")
FENCED_APPENDS = Counter(
    "pubsubd_storage_fenced_appends",
    "Appends refused because their epoch is below the ledger's fence (a zombie writer)",
)
FENCES = Counter("pubsubd_storage_fences", "Fence calls answered")
GROUP_COMMITS = Counter(
    "pubsubd_storage_group_commits",
    "Group writes (one write and fsync per disk for all the appends of a ledger waiting together)",
)
GROUP_APPENDS = Histogram(
    "pubsubd_storage_group_appends",
    "Appends per group write",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)
FSYNC_SECONDS = Histogram(
    "pubsubd_storage_fsync_seconds",
    "Time one disk took to write and fsync a group",
    buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
)
READ_BYTES = Counter("pubsubd_storage_read_bytes", "Frame bytes answered to Read")
LEDGERS = Gauge("pubsubd_storage_ledgers", "Ledgers held (with entries or a fence)")
DISK_HEALTHY = Gauge(
    "pubsubd_storage_disk_healthy", "1 while a data directory is healthy", ["disk"]
)
DISK_FREE = Gauge(
    "pubsubd_storage_disk_free_bytes", "Bytes this process may still write on a disk", ["disk"]
)
LAGGING_COPIES = Gauge(
    "pubsubd_storage_lagging_copies",
    "Ledger copies on healthy disks that miss entries (repaired at the next start)",
)
