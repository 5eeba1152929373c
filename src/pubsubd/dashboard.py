"""The dashboard's JSON API (``/api/...`` on the HTTP port) and its sampler, for a serving
process (``pubsubd serve``, a cluster's forwarders). The pages (``observability/static/``) read
these documents and nothing else, and scripts may read them too:

* ``/api/overview``: totals since the process started, rates and publish latency over the last
  minute, errors by code, every SLO's state and remaining error budget, the firing alerts'
  count, and the last minutes' history for the charts;
* ``/api/topics``, ``/api/topic?name=``: published messages and bytes, publish rate,
  subscriptions, delivery latency (and a topic's history);
* ``/api/subscriptions``, ``/api/subscription?name=``: backlog (messages, bytes, oldest
  unacked age), outstanding leases, consumers, delivered and acked counts, delivery latency
  (and history);
* ``/api/cluster``: one process, or this forwarder, the storage nodes and the routing table
  read from ZooKeeper (``control/cluster_view.py``, as ``pubsubd cluster status`` does).

The two lists page (``observability/listing.py``: ``page_size``, ``page_token``, ``filter``;
name order), so a document reads the numbers of one page only.

Every :data:`history.INTERVAL_S` the sampler adds the counters to a :class:`History` ring
(15 minutes), at most :data:`MAX_SERIES` topics and as many subscriptions each (the first
ones seen; the others have no history, their numbers are still shown); a subscription's
delivery latency is kept as the p50 and p99 of the acks sampled since the sample before.
Latency quantiles come from the SLI histograms (``observability/sli.py``): the upper bound of
the bucket holding the quantile, an upper estimate. Delivery (publish-to-ack) latency is that
of the acks ``sli.record_acks`` samples, per topic and per subscription, since the process
started; a name counted under the bounded label's ``_other`` has none (``null``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Histogram

from pubsubd.control.cluster_view import describe_routing, storage_and_routing
from pubsubd.control.routing_store import RoutingStore
from pubsubd.core.deadlines import within
from pubsubd.core.release import version
from pubsubd.observability import background, listing, metrics, sli
from pubsubd.observability.history import History, growth, quantile

if TYPE_CHECKING:
    from pubsubd.app import PubsubServer
    from pubsubd.core.roles import SubscribingForwarderApi

MAX_SERIES = 100
RATE_WINDOW_S = 60.0
LATENCY_BOUNDS = list(sli.LATENCY_BUCKETS)


def _counter(metric: Counter) -> float:
    return sum(s.value for m in metric.collect() for s in m.samples if s.name.endswith("_total"))


def _requests() -> dict[tuple[str, str], float]:
    """(method, code) -> requests answered, from ``pubsubd_rpc_requests_total``."""
    return {
        (s.labels["method"], s.labels["code"]): s.value
        for m in sli.RPC_REQUESTS.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }


def _buckets(histogram: Histogram, value: str, label: str = "method") -> list[float]:
    """Cumulative counts of the latency buckets whose ``label`` is ``value``, +Inf (the
    total) last."""
    rows = sorted(
        (float(s.labels["le"]), s.value)
        for m in histogram.collect()
        for s in m.samples
        if s.name.endswith("_bucket") and s.labels.get(label) == value
    )
    return [v for _, v in rows] or [0.0] * (len(LATENCY_BOUNDS) + 1)


def _buckets_by(histogram: Histogram, label: str) -> dict[str, list[float]]:
    """Every ``label`` value's cumulative bucket counts, +Inf (the total) last: one pass over
    the histogram for all of them."""
    rows: dict[str, list[tuple[float, float]]] = {}
    for m in histogram.collect():
        for s in m.samples:
            if s.name.endswith("_bucket"):
                rows.setdefault(s.labels[label], []).append((float(s.labels["le"]), s.value))
    return {value: [v for _, v in sorted(counts)] for value, counts in rows.items()}


def _latency_ms(counts: list[float] | None) -> dict[str, Any]:
    """Samples, p50 and p99 (ms) of cumulative bucket counts (None: no samples)."""
    counts = counts or [0.0] * (len(LATENCY_BOUNDS) + 1)
    return {
        "samples": int(counts[-1]),
        "p50": _ms(quantile(LATENCY_BOUNDS, counts, 0.5)),
        "p99": _ms(quantile(LATENCY_BOUNDS, counts, 0.99)),
    }


def _delivery_latency(
    budget: sli.LabelBudget, by_label: Mapping[str, list[float]], name: str
) -> dict[str, Any] | None:
    """Publish-to-ack latency of ``name``'s sampled acks since start (sli.record_acks); None
    when ``name`` is counted under the bounded label's ``_other`` (the budget is spent and
    ``name`` has no label of its own)."""
    label = budget.lookup(name)
    if label is None and budget.admitted >= budget.limit:
        return None
    return _latency_ms(None if label is None else by_label.get(label))


def _ms(seconds: float | None) -> float | None:
    if seconds is None:
        return None
    return None if seconds == float("inf") else round(seconds * 1000, 3)


class Budget:
    """The first ``limit`` names seen get a history series."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.names: set[str] = set()

    def admit(self, names: Iterable[str]) -> list[str]:
        for name in names:
            if len(self.names) >= self.limit:
                break
            self.names.add(name)
        return sorted(self.names)


class Reading:
    """What one document reads from the process, each part at most once however many rows
    need it: which subscribing forwarder serves each subscription, and the delivery latency
    histograms by topic and by subscription."""

    def __init__(self, server: PubsubServer) -> None:
        self.server = server

    @cached_property
    def served(self) -> dict[str, SubscribingForwarderApi]:
        return {
            name: subscribing
            for subscribing in self.server.routes.all_subscribing()
            for name in subscribing.subscription_names()
        }

    @cached_property
    def topic_latency(self) -> dict[str, list[float]]:
        return _buckets_by(sli.DELIVERY_LATENCY, "topic")

    @cached_property
    def subscription_latency(self) -> dict[str, list[float]]:
        return _buckets_by(sli.SUBSCRIPTION_DELIVERY_LATENCY, "subscription")

    def topic_delivery(self, name: str) -> dict[str, Any] | None:
        return _delivery_latency(sli.recorder().topics, self.topic_latency, name)

    def subscription_delivery(self, name: str) -> dict[str, Any] | None:
        return _delivery_latency(sli.recorder().subscriptions, self.subscription_latency, name)


class Dashboard:
    def __init__(self, server: PubsubServer, max_series: int = MAX_SERIES) -> None:
        self.server = server
        self.history = History()
        self.started = time.time()
        self._topics = Budget(max_series)
        self._subs = Budget(max_series)
        # subscription -> its delivery latency bucket counts at the last sample
        self._delivery_seen: dict[str, list[float]] = {}
        self._task: asyncio.Task[None] | None = None

    # --- the HTTP routes ------------------------------------------------------------------

    def routes(self) -> dict[str, Any]:
        return {
            "/api/overview": self.overview,
            "/api/topics": self.topics,
            "/api/topic": self.topic,
            "/api/subscriptions": self.subscriptions,
            "/api/subscription": self.subscription,
            "/api/cluster": self.cluster,
        }

    # --- sampling ---------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="dashboard_sampler")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _loop(self) -> None:
        self.sample()
        await background.every("dashboard sampler", self.history.interval_s, self.sample)

    def _totals(self) -> dict[str, float]:
        requests = _requests()
        return {
            "published": _counter(metrics.PUBLISHED_MESSAGES),
            "delivered": _counter(metrics.DELIVERED_MESSAGES),
            "acked": _counter(metrics.ACKED_MESSAGES),
            "requests": sum(requests.values()),
            "errors": sum(v for (_, c), v in requests.items() if c in sli.SERVER_FAULT_CODES),
            "caller_errors": sum(
                v for (_, c), v in requests.items() if c != "OK" and c not in sli.SERVER_FAULT_CODES
            ),
        }

    def sample(self, now: float | None = None) -> None:
        values = self._totals()
        for i, count in enumerate(_buckets(sli.RPC_LATENCY, "Publish")):
            values[f"publish_le:{i}"] = count
        reading = Reading(self.server)
        for name in self._topics.admit(self.server.catalog.topics):
            topic = self._topic_numbers(name, reading)
            if topic is not None:
                values[f"t:{name}:published"] = topic["published"]
                values[f"t:{name}:published_bytes"] = topic["published_bytes"]
        for name in self._subs.admit(sorted(reading.served)):
            sub = self._subscription_numbers(name, reading)
            if sub is not None:
                for key in ("backlog_messages", "oldest_unacked_age_s", "delivered", "acked"):
                    values[f"s:{name}:{key}"] = sub[key]
            values.update(self._delivery_since_last(name, reading))
        self.history.add(time.time() if now is None else now, values)

    def _delivery_since_last(self, name: str, reading: Reading) -> dict[str, float]:
        """The subscription's delivery latency p50 and p99 (ms) over the acks sampled since
        the last sample (the first time it is charted: since the process started); nothing
        when none were (a gap in the chart) or it has no label of its own."""
        counts = reading.subscription_latency.get(name)
        if counts is None:
            return {}
        new = growth(self._delivery_seen.get(name), counts)
        self._delivery_seen[name] = counts
        p50, p99 = (_ms(quantile(LATENCY_BOUNDS, new, q)) for q in (0.5, 0.99))
        if p50 is None or p99 is None:
            return {}
        return {f"s:{name}:delivery_p50_ms": p50, f"s:{name}:delivery_p99_ms": p99}

    # --- reading the process ----------------------------------------------------------------

    def _topic_numbers(self, name: str, reading: Reading) -> dict[str, Any] | None:
        entry = self.server.catalog.topics.get(name)
        if entry is None:
            return None
        uid = entry.record.uid
        published = self.server.publishing.published.get(uid, [0, 0])
        return {
            "name": name,
            "subscriptions": sorted(
                s.record.name for s in self.server.catalog.subscriptions_of(uid)
            ),
            "published": published[0],
            "published_bytes": published[1],
            "served_here": self.server.routes.serves_topic(uid),
            "delivery_latency_ms": reading.topic_delivery(name),
        }

    def _subscription_numbers(self, name: str, reading: Reading) -> dict[str, Any] | None:
        entry = self.server.catalog.subscriptions.get(name)
        subscribing = reading.served.get(name)
        if entry is None or subscribing is None:
            return None
        try:
            status = subscribing.status(name)
            backlog = subscribing.backlog_stats(name, self.server.clock.time_us())
        except Exception:  # deleted meanwhile
            return None
        return {
            "name": name,
            "topic": str(entry.subscription.topic),
            "backlog_messages": backlog.messages,
            "backlog_bytes": backlog.bytes,
            "oldest_unacked_age_s": round(backlog.oldest_age_s, 3),
            "outstanding": status["outstanding"],
            "consumers": status["consumers"],
            "delivered": status["delivered"],
            "acked": status["acked"],
            "delivery_latency_ms": reading.subscription_delivery(name),
            "status": status,
        }

    def _series(self, keys: Mapping[str, str]) -> dict[str, list[Any]]:
        """{"t": times, field: rates of the counter ``keys[field]``} (fields ending in
        ``_per_s``), or its values (the others)."""
        h = self.history
        out: dict[str, list[Any]] = {"t": [round(t, 3) for t in h.times()]}
        for field, key in keys.items():
            raw = h.rates(key) if field.endswith("_per_s") else h.values(key)
            out[field] = [None if v is None else round(v, 3) for v in raw]
        return out

    # --- the documents ----------------------------------------------------------------------

    def overview(self, query: Mapping[str, str]) -> dict[str, Any]:
        server = self.server
        h = self.history
        now = time.time()
        totals = self._totals()
        requests = _requests()
        errors: dict[str, float] = {}
        for (_, code), count in requests.items():
            if code != "OK":
                errors[code] = errors.get(code, 0) + count
        # Publish latency over the last minute: the bucket counts' growth since then.
        current = _buckets(sli.RPC_LATENCY, "Publish")
        first = h.at_or_before(now - RATE_WINDOW_S)
        since = (
            [first[1].get(f"publish_le:{i}", 0.0) for i in range(len(current))]
            if first is not None
            else [0.0] * len(current)
        )
        window = growth(since, current)
        p50s: list[float | None] = []
        p99s: list[float | None] = []
        previous: dict[str, float] | None = None
        for _, values in h.samples():
            if previous is None:
                p50s.append(None)
                p99s.append(None)
            else:
                counts = [
                    values.get(f"publish_le:{i}", 0.0) - previous.get(f"publish_le:{i}", 0.0)
                    for i in range(len(current))
                ]
                p50s.append(_ms(quantile(LATENCY_BOUNDS, counts, 0.5)))
                p99s.append(_ms(quantile(LATENCY_BOUNDS, counts, 0.99)))
            previous = values
        alerts = server.slo.alerts(time.monotonic())
        history = self._series(
            {
                "publish_per_s": "published",
                "deliver_per_s": "delivered",
                "ack_per_s": "acked",
                "errors_per_s": "errors",
            }
        )
        history["publish_p50_ms"] = p50s
        history["publish_p99_ms"] = p99s
        return {
            "now": round(now, 3),
            "version": version(),
            "uptime_s": round(now - self.started, 1),
            "mode": self._mode(),
            "topics": len(server.catalog.topics),
            "subscriptions": len(server.catalog.subscriptions),
            "totals": {k: int(v) for k, v in totals.items()},
            "rates": {
                "window_s": RATE_WINDOW_S,
                "publish_per_s": _live_rate(h, "published", totals["published"], now),
                "deliver_per_s": _live_rate(h, "delivered", totals["delivered"], now),
                "ack_per_s": _live_rate(h, "acked", totals["acked"], now),
                "requests_per_s": _live_rate(h, "requests", totals["requests"], now),
                "errors_per_s": _live_rate(h, "errors", totals["errors"], now),
            },
            "publish_latency_ms": {
                "window_s": RATE_WINDOW_S,
                "requests": int(window[-1]),
                "p50": _ms(quantile(LATENCY_BOUNDS, window, 0.5)),
                "p99": _ms(quantile(LATENCY_BOUNDS, window, 0.99)),
            },
            "errors_by_code": {k: int(v) for k, v in sorted(errors.items())},
            "slos": [
                {
                    k: o[k]
                    for k in (
                        "slo",
                        "scope",
                        "objective",
                        "target",
                        "sli",
                        "good",
                        "total",
                        "error_budget_remaining",
                        "firing",
                    )
                }
                for o in alerts["objectives"]
            ],
            "alerts_firing": len(alerts["firing"]),
            "disk": server.disk.status(),
            "history": history,
        }

    def _mode(self) -> str:
        if self.server.cluster is None:
            return "single process"
        return "cluster forwarder" if self.server.assigned else "cluster serving process"

    def topics(self, query: Mapping[str, str]) -> dict[str, Any]:
        request = listing.PageRequest.from_query(query)
        chosen = listing.page(self.server.catalog.topic_names(), request)
        reading = Reading(self.server)
        now = time.time()
        rows = []
        for name in chosen.names:
            numbers = self._topic_numbers(name, reading)
            if numbers is None:
                continue
            numbers["subscriptions"] = len(numbers["subscriptions"])
            numbers["publish_per_s"] = _live_rate(
                self.history, f"t:{name}:published", numbers["published"], now
            )
            rows.append(numbers)
        return {"topics": rows, **_paging(chosen)}

    def topic(self, query: Mapping[str, str]) -> dict[str, Any]:
        name = _name(query)
        reading = Reading(self.server)
        numbers = self._topic_numbers(name, reading)
        if numbers is None:
            raise LookupError(f"no topic {name}")
        numbers["publish_per_s"] = _live_rate(
            self.history, f"t:{name}:published", numbers["published"], time.time()
        )
        briefs = (self._brief(s, reading) for s in numbers["subscriptions"])
        numbers["subscription_backlogs"] = [b for b in briefs if b is not None]
        numbers["history"] = self._series(
            {
                "publish_per_s": f"t:{name}:published",
                "publish_bytes_per_s": f"t:{name}:published_bytes",
            }
        )
        return numbers

    def _brief(self, name: str, reading: Reading) -> dict[str, Any] | None:
        numbers = self._subscription_numbers(name, reading)
        if numbers is None:
            return None
        numbers.pop("status")
        return numbers

    def subscriptions(self, query: Mapping[str, str]) -> dict[str, Any]:
        request = listing.PageRequest.from_query(query)
        reading = Reading(self.server)
        chosen = listing.page(sorted(reading.served), request)
        rows = [self._brief(name, reading) for name in chosen.names]
        return {"subscriptions": [r for r in rows if r is not None], **_paging(chosen)}

    def subscription(self, query: Mapping[str, str]) -> dict[str, Any]:
        name = _name(query)
        numbers = self._subscription_numbers(name, Reading(self.server))
        if numbers is None:
            raise LookupError(f"no subscription {name} served by this process")
        now = time.time()
        numbers["deliver_per_s"] = _live_rate(
            self.history, f"s:{name}:delivered", numbers["delivered"], now
        )
        numbers["ack_per_s"] = _live_rate(self.history, f"s:{name}:acked", numbers["acked"], now)
        numbers["history"] = self._series(
            {
                "backlog_messages": f"s:{name}:backlog_messages",
                "oldest_unacked_age_s": f"s:{name}:oldest_unacked_age_s",
                "deliver_per_s": f"s:{name}:delivered",
                "ack_per_s": f"s:{name}:acked",
                "delivery_p50_ms": f"s:{name}:delivery_p50_ms",
                "delivery_p99_ms": f"s:{name}:delivery_p99_ms",
            }
        )
        return numbers

    async def cluster(self, query: Mapping[str, str]) -> dict[str, Any]:
        server = self.server
        if server.cluster is None:
            return {"mode": "single process", "cluster": None}
        out: dict[str, Any] = {"mode": self._mode(), "this_process": server.cluster_status()}
        coordinator = server.cluster.coordinator
        try:
            out["cluster"] = await within(storage_and_routing(coordinator), 10)
            out["routing"] = await within(describe_routing(RoutingStore(coordinator)), 10)
        except Exception as e:  # ZooKeeper unreachable: the page says so
            out["error"] = f"ZooKeeper: {type(e).__name__}: {e}"
        return out


def _name(query: Mapping[str, str]) -> str:
    name = query.get("name", "")
    if not name:
        raise ValueError("the name= parameter is missing")
    return name


def _paging(chosen: listing.Page) -> dict[str, Any]:
    """A list document's paging fields."""
    return {
        "next_page_token": chosen.next_page_token,
        "previous_page_token": chosen.previous_page_token,
        "total": chosen.total,
        "offset": chosen.offset,
    }


def _live_rate(h: History, key: str, current: float, now: float) -> float | None:
    """Per second over about the last minute: from the sample then to the value now."""
    first = h.at_or_before(now - RATE_WINDOW_S)
    if first is None or now <= first[0]:
        return None
    before = first[1].get(key)
    if before is None or current < before:
        return None
    return round((current - before) / (now - first[0]), 3)
