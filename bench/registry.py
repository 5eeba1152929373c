"""Which benchmark workloads and targets exist: the registry ``bench.run`` selects from.

A target is a server the workloads run against (``bench/targets.py`` starts them): pubsubd with
``--fsync always`` and ``--fsync interval``, Google's emulator, and the null server (the official
client's own ceiling); with ``--baseline REV`` also ``pubsubd-baseline``, the ``pubsubd`` target
running another revision's code, which runs every workload ``pubsubd`` runs. A
:class:`Workload` names a function of ``bench/workloads.py``, its parameters at full and quick
size, the targets it runs on and how it is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ALL_TARGETS = ("pubsubd", "pubsubd-interval", "emulator", "null")
CORE_TARGETS = ("pubsubd", "emulator", "null")  # fsync=interval only matters for publishing
BASE = "pubsubd"  # the target the ratios are about
# pubsubd as of another revision (bench.run --baseline REV), beside BASE in every workload.
BASELINE = "pubsubd-baseline"
KNOWN_TARGETS = (*ALL_TARGETS, BASELINE)


def with_baseline(targets: tuple[str, ...]) -> tuple[str, ...]:
    """``targets`` plus the baseline target wherever pubsubd runs (a session has the baseline
    target only when it was asked for)."""
    return (*targets, BASELINE) if BASE in targets and BASELINE not in targets else targets


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # function in bench.workloads
    title: str
    full: dict[str, Any]
    quick: dict[str, Any]
    targets: tuple[str, ...] = ALL_TARGETS
    latency: bool = False  # reports percentiles instead of a rate
    # Workloads whose rate is compared with other workloads' of the same session (feature cost).
    baselines: tuple[str, ...] = ()
    # Figures reported in a table of their own instead of a rate (the names workloads).
    report: tuple[str, ...] = ()
    # Run without --only (the names workloads take many minutes: only when asked for).
    in_default: bool = True
    # Targets of full-size runs, if fewer than ``targets`` (the emulator runs a thread per
    # subscription: 100k of them would swamp the machine).
    full_targets: tuple[str, ...] = ()
    # Each run gets a freshly started target (its RSS, fds and data dir are measured).
    fresh_target: bool = False

    def targets_for(self, quick: bool) -> tuple[str, ...]:
        return with_baseline(self.full_targets if self.full_targets and not quick else self.targets)

    def params(self, quick: bool) -> dict[str, Any]:
        return self.quick if quick else self.full

    def bound_s(self, quick: bool) -> float:
        """Worst-case duration of one measurement, for the worker's kill timeout."""
        p = self.params(quick)
        if self.latency:
            return float(p["duration_s"] + p["warmup_s"] + 45)
        if self.report:  # creating is bounded by time_limit_s, and so is cleaning up
            return float(2 * p["time_limit_s"] + p.get("idle_s", 0) + 60)
        return float(p["time_limit_s"] + 30)


def _publish_client(size: int, label: str) -> Workload:
    return Workload(
        f"publish-client-{label}",
        "publish_client",
        f"Publish {label}, official PublisherClient (batch ≤1000 msgs / 1 MB / 10 ms)",
        {"size": size, "count": 50_000, "time_limit_s": 20.0},
        {"size": size, "count": 10_000, "time_limit_s": 10.0},
    )


def _publish_raw(size: int, label: str, count: int) -> Workload:
    return Workload(
        f"publish-raw-{label}",
        "publish_raw",
        f"Publish {label}, raw gRPC (1000-msg requests, 4 in flight)",
        {"size": size, "count": count, "batch": 1000, "concurrency": 4, "time_limit_s": 3.0},
        {"size": size, "count": count, "batch": 1000, "concurrency": 4, "time_limit_s": 1.5},
    )


FEATURE_TARGETS = ("pubsubd",)  # the emulator ignores filters and delays
DRAIN_PLAIN = "drain-raw"
PUBLISH_PLAIN = "publish-raw-100B"


def _drain_feature(name: str, title: str, baselines: tuple[str, ...], **extra: Any) -> Workload:
    """A raw drain (like drain-raw) with a delivery feature, compared with plainer drains."""
    return Workload(
        name,
        "drain_raw",
        title,
        {"count": 100_000, "size": 100, "max_messages": 5000, "time_limit_s": 30.0, **extra},
        {"count": 20_000, "size": 100, "max_messages": 5000, "time_limit_s": 15.0, **extra},
        targets=FEATURE_TARGETS,
        baselines=baselines,
    )


def _publish_feature(name: str, attributes: str, title: str) -> Workload:
    params = {"size": 100, "count": 10_000_000, "batch": 1000, "concurrency": 4}
    return Workload(
        name,
        "publish_raw",
        title,
        {**params, "time_limit_s": 3.0, "attributes": attributes},
        {**params, "time_limit_s": 1.5, "attributes": attributes},
        targets=FEATURE_TARGETS,
        baselines=(PUBLISH_PLAIN,),
    )


NAMES_REPORT = (
    "create_topics_per_s",
    "create_subs_per_s",
    "list_topics_per_s",
    "list_subs_per_s",
    "delete_subs_per_s",
    "delete_topics_per_s",
    "create_topics_server_cpu_pct",
    "create_topics_client_cpu_pct",
    "create_subs_server_cpu_pct",
    "create_subs_client_cpu_pct",
    "delete_subs_server_cpu_pct",
    "delete_topics_server_cpu_pct",
    "rss_mb_before",
    "rss_mb_created",
    "rss_mb_per_1k_names",
    "fds_before",
    "fds_created",
    "data_mb_before",
    "data_entries_before",
    "data_mb_created",
    "data_entries_created",
    "idle_server_cpu_pct",
    "rss_mb_deleted",
    "fds_deleted",
    "data_mb_deleted",
    "data_entries_deleted",
)


def _names(name: str, title: str, topics: int, subs_per_topic: int, quick_topics: int) -> Workload:
    params = {"subs_per_topic": subs_per_topic, "threads": 16, "idle_s": 6.0}
    return Workload(
        name,
        "names",
        title,
        {**params, "topics": topics, "time_limit_s": 1500.0},
        {**params, "topics": quick_topics, "time_limit_s": 300.0},
        targets=("pubsubd", "emulator"),
        full_targets=("pubsubd",),
        fresh_target=True,
        report=NAMES_REPORT,
        in_default=False,
    )


WORKLOADS: tuple[Workload, ...] = (
    _publish_client(100, "100B"),
    _publish_client(1024, "1KiB"),
    _publish_raw(100, "100B", 10_000_000),
    _publish_raw(1024, "1KiB", 4_000_000),
    Workload(
        "latency-1000",
        "latency",
        "End-to-end latency at 1000 msg/s, 100 B (official publisher → subscribe() callback)",
        {"rate": 1000, "duration_s": 10.0, "warmup_s": 1.0, "size": 100},
        {"rate": 1000, "duration_s": 3.0, "warmup_s": 1.0, "size": 100},
        targets=CORE_TARGETS,
        latency=True,
    ),
    Workload(
        "publish-latency-1000",
        "publish_latency",
        "Publish acknowledgement latency at 1000 msg/s, 100 B: a raw Publish RPC of 10 messages "
        "every 10 ms (what the official client's 10 ms batch timer sends at this rate), open loop",
        {"rate": 1000, "batch": 10, "duration_s": 10.0, "warmup_s": 1.0, "size": 100},
        {"rate": 1000, "batch": 10, "duration_s": 3.0, "warmup_s": 1.0, "size": 100},
        targets=CORE_TARGETS,
        latency=True,
        in_default=False,  # python -m bench.cluster runs it; bench.run only when asked for
    ),
    Workload(
        "drain-client",
        "drain_client",
        "Drain a backlog of 100 B messages, official subscribe() + ack (FlowControl 5000)",
        {"count": 100_000, "size": 100, "max_messages": 5000, "time_limit_s": 15.0},
        {"count": 20_000, "size": 100, "max_messages": 5000, "time_limit_s": 8.0},
        targets=CORE_TARGETS,
    ),
    Workload(
        "drain-raw",
        "drain_raw",
        "Drain a backlog of 100 B messages, raw StreamingPull + unary Acknowledge (max 5000 out)",
        {"count": 100_000, "size": 100, "max_messages": 5000, "time_limit_s": 15.0},
        {"count": 20_000, "size": 100, "max_messages": 5000, "time_limit_s": 8.0},
        targets=CORE_TARGETS,
    ),
    _drain_feature(
        "drain-raw-attrs",
        "drain-raw with 2 attributes per message (no filter): the baseline of the filter",
        (DRAIN_PLAIN,),
        attributes="half",
    ),
    _drain_feature(
        "drain-raw-filter",
        'drain-raw through the filter attributes.half = "yes" (matches half; 2 attributes)',
        (DRAIN_PLAIN, "drain-raw-attrs"),
        attributes="half",
        filter_half=True,
    ),
    _drain_feature(
        "drain-raw-b100",
        "drain-raw of a backlog published in 100-message requests: the baseline of ordering",
        (DRAIN_PLAIN,),
        batch=100,
    ),
    _drain_feature(
        "drain-raw-ordered",
        "drain-raw with enable_message_ordering, 100 keys (one per 100-message request)",
        (DRAIN_PLAIN, "drain-raw-b100"),
        batch=100,
        keys=100,
        ordering=True,
    ),
    _drain_feature(
        "drain-raw-delay",
        'drain-raw of messages with "pubsubd.deliver_after" = "0" (delay path, due at once)',
        (DRAIN_PLAIN,),
        attributes="delay",
    ),
    _drain_feature(
        "drain-raw-delayed",
        'drain-raw of messages with "pubsubd.deliver_after" = "3": each waits in the on-disk '
        "delay index and is handed back when due (timed from the first delivery)",
        (DRAIN_PLAIN, "drain-raw-delay"),
        attributes="delay3",
        timed_from_first=True,
    ),
    _publish_feature(
        "publish-raw-attrs", "half", "Publish 100 B + 2 attributes, raw gRPC (1000-msg requests)"
    ),
    _publish_feature(
        "publish-raw-delay",
        "delay",
        'Publish 100 B + "pubsubd.deliver_after" = "0", raw gRPC (1000-msg requests)',
    ),
    _publish_feature(
        "publish-raw-delayed",
        "delay3600",
        'Publish 100 B + "pubsubd.deliver_after" = "3600" (every message indexed on disk), '
        "raw gRPC (1000-msg requests)",
    ),
    _names("names-1sub", "Topics with one subscription each", 100_000, 1, 10_000),
    _names("names-100subs", "Topics with 100 subscriptions each", 1_000, 100, 100),
)

# Warm-up per target (JIT, caches, connections): not reported.
WARMUP: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "publish_raw",
        {"size": 100, "count": 200_000, "batch": 1000, "concurrency": 4, "time_limit_s": 2.0},
    ),
    ("drain_raw", {"count": 5_000, "size": 100, "max_messages": 5000, "time_limit_s": 5.0}),
    ("publish_client", {"size": 100, "count": 5_000, "time_limit_s": 5.0}),
)


def select(only: str | None) -> list[Workload]:
    if not only:
        return [w for w in WORKLOADS if w.in_default]
    wanted = [s.strip() for s in only.split(",") if s.strip()]
    # "=name" selects exactly that workload (e.g. "=drain-raw" without the drain-raw-* ones).
    chosen = [
        w
        for w in WORKLOADS
        if any(
            w.name == s.removeprefix("=") or (s[0] != "=" and w.name.startswith(s)) for s in wanted
        )
    ]
    if not chosen:
        raise SystemExit(f"--only {only!r} matches no workload; see --list")
    return chosen
