"""Request SLIs: every RPC's outcome and latency, on /metrics and for the SLO monitor.

Each served RPC is recorded once where it is answered (the one process, or the forwarder that
serves it in a cluster) by :func:`record_rpc`:

* ``pubsubd_rpc_requests_total{method, code}`` for every google.pubsub.v1 RPC (a StreamingPull
  is one request, recorded when the stream ends: ``OK`` for an end the client chose) and
  ``pubsubd_rpc_latency_seconds{method}`` of the successful unary ones (fixed buckets,
  :data:`LATENCY_BUCKETS`);
* ``pubsubd_topic_publish_requests_total{topic, code}`` and
  ``pubsubd_topic_publish_latency_seconds{topic}`` (successful ones) for Publish, per topic.

Cardinality is bounded: ``method`` and ``code`` come from fixed sets (the API's methods, gRPC's
17 codes), and ``topic`` takes at most ``max_topics`` values (``PUBSUBD_METRICS_MAX_TOPICS``,
default 100) besides the topics an SLO file names: the first topics seen get their own series,
any later one is counted under ``topic="_other"``. A process thus exports at most
(100 + named) x 17 publish series and 13 buckets per topic. ``subscription`` is bounded the
same way by one budget (``PUBSUBD_METRICS_MAX_SUBSCRIPTIONS``, default 100) shared by every
per-subscription series: the backlog gauges (:class:`BacklogCollector`, read at scrape time;
the rest summed under ``_other``) and the delivery latency of sampled acks
(``pubsubd_subscription_delivery_latency_seconds``, :func:`record_acks`).
``pubsubd_topic_oldest_unacked_message_age_seconds{topic}`` (the oldest unacked message of the
topic's subscriptions, for the backlog-age SLO per topic) bounds ``topic`` like the publish
series (the SLO file's topics always have their own).

Which outcomes are *good* is the SLIs' business: a request fails its availability SLI only with
a code that is the service's fault (:data:`SERVER_FAULT_CODES`); INVALID_ARGUMENT, NOT_FOUND and
the like are the caller's. ``slo.py`` reads the same counts, kept here as plain numbers as well
(:class:`SliCounts`), to evaluate burn rates in the process. The backlog-age SLI is not a
request SLI but a freshness one: each of the SLO monitor's samples of the oldest unacked ages
(:meth:`SliCounts.record_backlog`) is one event, good when the age is within the threshold.
Nor is the prober availability SLI: each result of a prober running in the process
(:func:`record_probe`) is one event, good when the probe succeeded.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

OTHER = "_other"

# Set by the Publish handler once it parsed the request, for the per-topic series.
PUBLISH_TOPIC: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "pubsubd_publish_topic", default=None
)
DEFAULT_MAX_TOPICS = 100
DEFAULT_MAX_SUBSCRIPTIONS = 100

# Seconds; every latency objective's threshold must be one of them (slo.py checks).
LATENCY_BUCKETS = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
)

SERVER_FAULT_CODES = frozenset(
    {"INTERNAL", "UNAVAILABLE", "UNKNOWN", "DATA_LOSS", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"}
)

# The RPCs behind each availability SLI (control_plane: resource management).
PUBLISH_METHODS = frozenset({"Publish"})
PULL_METHODS = frozenset(
    {"Pull", "StreamingPull", "Acknowledge", "ModifyAckDeadline"},
)
CONTROL_PLANE_METHODS = frozenset(
    {
        "CreateTopic",
        "GetTopic",
        "UpdateTopic",
        "DeleteTopic",
        "ListTopics",
        "ListTopicSubscriptions",
        "ListTopicSnapshots",
        "DetachSubscription",
        "CreateSubscription",
        "GetSubscription",
        "UpdateSubscription",
        "DeleteSubscription",
        "ListSubscriptions",
        "ModifyPushConfig",
        "CreateSnapshot",
        "GetSnapshot",
        "UpdateSnapshot",
        "DeleteSnapshot",
        "ListSnapshots",
        "Seek",
    }
)
# Acks are not requests of their own: a sampled ack's delivery latency is recorded under this
# pseudo-method (``record_acks``).
DELIVERY = "_delivery"
# A prober running in this process (``serve --prober-interval``) tallies each probe's result
# under this pseudo-method (``record_probe``): the prober availability SLI, the share of probes
# that succeeded. The probers export the same results as ``PROBES_METRIC`` (with ``_total``)
# labelled ``result`` PROBE_SUCCESS or PROBE_FAILURE (prober/loop.py), which the Prometheus
# rules of ``slo.py`` read.
PROBE = "_probe"
PROBER = "prober"
PROBES_METRIC = "pubsubd_prober_probes"
PROBE_SUCCESS = "success"
PROBE_FAILURE = "failure"
SLI_METHODS = {
    "publish": PUBLISH_METHODS,
    "pull": PULL_METHODS,
    "control_plane": CONTROL_PLANE_METHODS,
    "delivery": frozenset({DELIVERY}),
    PROBER: frozenset({PROBE}),
}
ACK_SAMPLES = 2  # acks per ack batch whose delivery latency is measured

RPC_REQUESTS = Counter(
    "pubsubd_rpc_requests",
    "google.pubsub.v1 requests answered, by method and gRPC code (a StreamingPull when it ends)",
    ["method", "code"],
)
RPC_LATENCY = Histogram(
    "pubsubd_rpc_latency_seconds",
    "Time to answer a unary google.pubsub.v1 request, by method",
    ["method"],
    buckets=LATENCY_BUCKETS,
)
TOPIC_PUBLISH_REQUESTS = Counter(
    "pubsubd_topic_publish_requests",
    "Publish requests answered, by topic (bounded, see /status sli) and gRPC code",
    ["topic", "code"],
)
DELIVERY_LATENCY = Histogram(
    "pubsubd_delivery_latency_seconds",
    "Publish time to acknowledgement of sampled acks (ACK_SAMPLES of each ack batch), by topic",
    ["topic"],
    buckets=LATENCY_BUCKETS,
)
SUBSCRIPTION_DELIVERY_LATENCY = Histogram(
    "pubsubd_subscription_delivery_latency_seconds",
    "Publish time to acknowledgement of sampled acks (ACK_SAMPLES of each ack batch), by "
    "subscription (bounded, see /status sli)",
    ["subscription"],
    buckets=LATENCY_BUCKETS,
)
TOPIC_PUBLISH_LATENCY = Histogram(
    "pubsubd_topic_publish_latency_seconds",
    "Time to answer a Publish request, by topic (bounded, see /status sli)",
    ["topic"],
    buckets=LATENCY_BUCKETS,
)


class LabelBudget:
    """At most ``limit`` label values besides the pinned ones; later values become OTHER."""

    def __init__(self, limit: int, pinned: Iterable[str] = ()) -> None:
        self.limit = limit
        self.pinned = frozenset(pinned)
        self._admitted: set[str] = set()
        self.refused = 0  # values counted under OTHER so far (calls, not distinct values)

    def label(self, value: str) -> str:
        if value in self.pinned or value in self._admitted:
            return value
        if len(self._admitted) < self.limit:
            self._admitted.add(value)
            return value
        self.refused += 1
        return OTHER

    def lookup(self, value: str) -> str | None:
        """``value``'s own label if it has one (admitting nothing), else None."""
        return value if value in self.pinned or value in self._admitted else None

    @property
    def admitted(self) -> int:
        return len(self._admitted)


@dataclass(slots=True)
class Tally:
    """Good and total events of one SLI in one scope, since the process started."""

    good: int = 0
    total: int = 0


BACKLOG = "backlog"  # the freshness SLI's name: the oldest unacked message's age


@dataclass(frozen=True, slots=True)
class Indicator:
    """A ratio SLI: ``kind`` availability (of all requests, good = not a server fault),
    latency (of the successful requests, good = answered within ``threshold_s``) or freshness
    (``sli`` BACKLOG: of the monitor's samples, good = the oldest unacked message of every
    subscription in scope at most ``threshold_s`` old). ``sli`` names the RPCs (a key of
    SLI_METHODS) or BACKLOG; ``topic`` narrows the SLI to one topic; ``exclude`` (freshness,
    every topic) leaves out the topics judged by an objective of their own."""

    sli: str
    kind: str
    threshold_s: float = 0.0
    topic: str | None = None
    exclude: frozenset[str] = frozenset()


@dataclass
class SliCounts:
    """The tallies of the indicators the SLO monitor watches (O(matching indicators) per
    request)."""

    indicators: list[Indicator] = field(default_factory=list)
    tallies: dict[Indicator, Tally] = field(default_factory=dict)
    # method -> (topic or None, availability?, threshold_s, tally) of its indicators
    _by_method: dict[str, list[tuple[str | None, bool, float, Tally]]] = field(default_factory=dict)
    _freshness: list[tuple[Indicator, Tally]] = field(default_factory=list)

    def watch(self, indicators: Iterable[Indicator]) -> None:
        for indicator in indicators:
            if indicator in self.tallies:
                continue
            self.indicators.append(indicator)
            tally = self.tallies[indicator] = Tally()
            if indicator.kind == "freshness":
                self._freshness.append((indicator, tally))
                continue
            watched = (
                indicator.topic,
                indicator.kind == "availability",
                indicator.threshold_s,
                tally,
            )
            for method in SLI_METHODS[indicator.sli]:
                self._by_method.setdefault(method, []).append(watched)

    def record(self, method: str, code: str, seconds: float, topic: str | None) -> None:
        watched = self._by_method.get(method)
        if not watched:
            return
        fault = code in SERVER_FAULT_CODES
        ok = code == "OK"
        for only, availability, threshold_s, tally in watched:
            if only is not None and only != topic:
                continue
            if availability:
                tally.total += 1
                tally.good += not fault
            elif ok:
                tally.total += 1
                tally.good += seconds <= threshold_s

    def record_probe(self, ok: bool) -> None:
        """One probe's result: an event of the prober availability indicators, good when the
        probe succeeded (whatever made one fail, the service failed its client)."""
        for _, availability, _, tally in self._by_method.get(PROBE, ()):
            if availability:
                tally.total += 1
                tally.good += ok

    def record_backlog(self, ages: Iterable[tuple[str, float]]) -> None:
        """One sample of the freshness indicators, from the (topic, oldest unacked age in s) of
        every subscription served here: one event each, good when its scope's worst age is
        within its threshold (no subscription in scope: good, nothing waits)."""
        if not self._freshness:
            return
        worst = worst_ages(ages)
        for indicator, tally in self._freshness:
            tally.total += 1
            tally.good += scope_age(worst, indicator.topic, indicator.exclude) <= (
                indicator.threshold_s
            )


def worst_ages(ages: Iterable[tuple[str, float]]) -> dict[str, float]:
    """The oldest unacked age of each topic: the max over its subscriptions."""
    worst: dict[str, float] = {}
    for topic, age in ages:
        if age > worst.get(topic, -math.inf):
            worst[topic] = age
    return worst


def scope_age(worst: dict[str, float], topic: str | None, exclude: frozenset[str]) -> float:
    """The worst age of one topic (``topic``), or of every topic but ``exclude`` (None); 0.0
    when no subscription is in scope."""
    if topic is not None:
        return worst.get(topic, 0.0)
    return max((age for t, age in worst.items() if t not in exclude), default=0.0)


class Recorder:
    """The process's request SLIs: Prometheus series plus the monitor's tallies."""

    def __init__(
        self,
        max_topics: int = DEFAULT_MAX_TOPICS,
        max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS,
    ) -> None:
        self.topics = LabelBudget(max_topics)
        # One budget for the subscription label of every series (backlog, delivery latency).
        self.subscriptions = LabelBudget(max_subscriptions)
        self.counts = SliCounts()
        self.backlog: BacklogCollector | None = None
        # The labelled children, looked up once: prometheus_client's labels() takes a lock
        # and builds a tuple each call, most of a record's cost.
        self._children: dict[tuple[object, ...], Any] = {}
        # (method, code, topic label) -> the counters and histograms it counts in (bounded:
        # the methods, 17 codes and the bounded topic labels).
        self._series: dict[tuple[str, str, str | None], tuple[list[Any], list[Any]]] = {}

    def pin_topics(self, topics: Iterable[str]) -> None:
        self.topics = LabelBudget(self.topics.limit, [*self.topics.pinned, *topics])

    def child(self, metric: Any, *labels: str) -> Any:
        key = (metric, *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def record(self, method: str, code: str, seconds: float, topic: str | None = None) -> None:
        label = None if topic is None else self.topics.label(topic)
        key = (method, code, label)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self._series_of(method, code, label)
        counters, histograms = series
        for counter in counters:
            counter.inc()
        for histogram in histograms:
            histogram.observe(seconds)
        self.counts.record(method, code, seconds, topic)

    def _series_of(self, method: str, code: str, label: str | None) -> tuple[list[Any], list[Any]]:
        """The children a request of this method, code and topic label counts in."""
        counters = [self.child(RPC_REQUESTS, method, code)]
        histograms = []
        ok = code == "OK"
        if ok and method != "StreamingPull":
            histograms.append(self.child(RPC_LATENCY, method))
        if label is not None:
            counters.append(self.child(TOPIC_PUBLISH_REQUESTS, label, code))
            if ok:
                histograms.append(self.child(TOPIC_PUBLISH_LATENCY, label))
        return counters, histograms

    def status(self) -> dict[str, object]:
        status: dict[str, object] = {
            "topic_labels": self.topics.admitted,
            "topic_label_limit": self.topics.limit,
            "topic_labels_pinned": len(self.topics.pinned),
            "requests_counted_as_other_topic": self.topics.refused,
        }
        status["subscription_labels"] = self.subscriptions.admitted
        status["subscription_label_limit"] = self.subscriptions.limit
        if self.backlog is not None:
            status["backlog_topic_labels"] = self.backlog.topics.admitted
        return status


@dataclass(frozen=True, slots=True)
class BacklogRow:
    """One subscription served here: its topic, unacked messages and bytes, and the age in
    seconds of its oldest unacked message."""

    subscription: str
    topic: str
    messages: int
    bytes: int
    oldest_age_s: float


BacklogSource = Callable[[], Iterable[BacklogRow]]


class BacklogCollector(Collector):  # type: ignore[misc]
    """Backlog SLIs read at scrape time: ``pubsubd_subscription_backlog_messages``,
    ``_backlog_bytes`` and ``pubsubd_subscription_oldest_unacked_message_age_seconds`` per
    subscription, and ``pubsubd_topic_oldest_unacked_message_age_seconds`` per topic (the max
    over its subscriptions). The ``subscription`` label is bounded like ``topic`` (``budget``,
    the recorder's, shared with the delivery latency); the others are summed (age: the oldest)
    under ``_other``. ``topic`` has a budget of its own (``max_topics`` besides
    ``pinned_topics``, the SLO file's), so scrapes leave the publish series' ``refused`` count
    alone."""

    def __init__(
        self,
        source: BacklogSource,
        budget: LabelBudget,
        max_topics: int = DEFAULT_MAX_TOPICS,
        pinned_topics: Iterable[str] = (),
    ) -> None:
        self.source = source
        self.budget = budget
        self.topics = LabelBudget(max_topics, pinned_topics)

    def collect(self) -> Iterable[GaugeMetricFamily]:
        messages = GaugeMetricFamily(
            "pubsubd_subscription_backlog_messages",
            "Messages not yet acknowledged, by subscription (bounded, see /status sli)",
            labels=["subscription"],
        )
        size = GaugeMetricFamily(
            "pubsubd_subscription_backlog_bytes",
            "Stored bytes of the messages not yet acknowledged, by subscription",
            labels=["subscription"],
        )
        age = GaugeMetricFamily(
            "pubsubd_subscription_oldest_unacked_message_age_seconds",
            "Age of the oldest message not yet acknowledged, by subscription",
            labels=["subscription"],
        )
        topic_age = GaugeMetricFamily(
            "pubsubd_topic_oldest_unacked_message_age_seconds",
            "Age of the oldest message not yet acknowledged by any subscription of the topic "
            "(bounded like the publish series, see /status sli)",
            labels=["topic"],
        )
        rows: dict[str, list[float]] = {}
        topics: dict[str, float] = {}
        for b in self.source():
            row = rows.setdefault(self.budget.label(b.subscription), [0, 0, 0.0])
            row[0] += b.messages
            row[1] += b.bytes
            row[2] = max(row[2], b.oldest_age_s)
            topic = self.topics.label(b.topic)
            topics[topic] = max(topics.get(topic, 0.0), b.oldest_age_s)
        for label in sorted(rows):
            total, total_bytes, oldest_s = rows[label]
            messages.add_metric([label], total)
            size.add_metric([label], total_bytes)
            age.add_metric([label], oldest_s)
        for label in sorted(topics):
            topic_age.add_metric([label], topics[label])
        return [messages, size, age, topic_age]


def register_backlog(source: BacklogSource) -> Callable[[], None]:
    """Export the backlog SLIs of ``source`` (the subscription label bounded by the recorder's
    budget, the topic label like the recorder's: :func:`configure`, called first); returns the
    function that stops it."""
    if _recorder.backlog is not None:  # one server per process; a second one replaces it
        with contextlib.suppress(KeyError):
            REGISTRY.unregister(_recorder.backlog)
    collector = BacklogCollector(
        source, _recorder.subscriptions, _recorder.topics.limit, _recorder.topics.pinned
    )
    REGISTRY.register(collector)
    _recorder.backlog = collector

    def stop() -> None:
        with contextlib.suppress(KeyError):
            REGISTRY.unregister(collector)

    return stop


def bucket_index(threshold_s: float) -> int | None:
    """The index of ``threshold_s`` among LATENCY_BUCKETS, None if it is not a bound."""
    i = bisect.bisect_left(LATENCY_BUCKETS, threshold_s)
    if i < len(LATENCY_BUCKETS) and abs(LATENCY_BUCKETS[i] - threshold_s) < 1e-9:
        return i
    return None


_recorder = Recorder()


def recorder() -> Recorder:
    return _recorder


_enabled = True


def configure(
    max_topics: int,
    pinned_topics: Iterable[str] = (),
    enabled: bool = True,
    max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS,
) -> Recorder:
    """Replace the process's recorder (at start-up, before serving). ``enabled=False``
    (``PUBSUBD_REQUEST_SLIS=0``) records nothing: for measuring what the SLIs cost."""
    global _recorder, _enabled
    _recorder = Recorder(max_topics, max_subscriptions)
    _recorder.pin_topics(pinned_topics)
    _enabled = enabled
    return _recorder


def record_rpc(method: str, code: str, seconds: float, topic: str | None = None) -> None:
    """Hook for every google.pubsub.v1 RPC (api/grpc/status.py); never raises."""
    if _enabled:
        _recorder.record(method, code, seconds, topic)


def record_probe(ok: bool) -> None:
    """Hook for each result of a prober running in this process (prober/loop.py, next to
    ``PROBES_METRIC``); a no-op where no objective watches probes. Never raises."""
    if _enabled:
        _recorder.counts.record_probe(ok)


def record_acks(
    topic: str,
    subscription: str,
    positions: Sequence[int],
    publish_time_us: Callable[[int], int],
    now_us: float,
) -> None:
    """Hook for a subscription's acks: the delivery latency (publish time to ack) of up to
    ACK_SAMPLES acks of the batch, picked at random, by topic and by subscription (both labels
    bounded); a ratio of good to all samples is an unbiased estimate of the ratio over every
    ack. O(1) per batch: nothing is done per acked message. Never raises."""
    if not positions or not _enabled:
        return
    by_topic = _recorder.child(DELIVERY_LATENCY, _recorder.topics.label(topic))
    by_subscription = _recorder.child(
        SUBSCRIPTION_DELIVERY_LATENCY, _recorder.subscriptions.label(subscription)
    )
    n = len(positions)
    for _ in range(min(ACK_SAMPLES, n)):
        try:
            published = publish_time_us(positions[random.randrange(n)])
        except Exception:  # trimmed, unknown source, closed log: not measurable
            continue
        seconds = max(0.0, now_us - published) / 1e6
        by_topic.observe(seconds)
        by_subscription.observe(seconds)
        _recorder.counts.record(DELIVERY, "OK", seconds, topic)
