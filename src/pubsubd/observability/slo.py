"""Service level objectives: the SLO file, multi-window burn-rate alerts, Prometheus rules (pure).

One TOML (or JSON) file holds every objective, globally at the top level and per topic under
``[topics."projects/p/topics/t"]``; ``pubsubd serve --slo``, ``pubsubd slo export-rules`` and
``pubsubd sli-report`` read the same file. Keys (defaults in :data:`DEFAULT_SLO`):

* ``publish_availability``, ``pull_availability``, ``control_plane_availability``: the share of
  requests not failed by the service (``sli.SERVER_FAULT_CODES``); per topic: publish only.
* ``publish_p99_ms``, ``publish_p95_ms``: 99 % (95 %) of successful publishes answered within
  that many milliseconds; a threshold must be a histogram bucket bound (``sli.LATENCY_BUCKETS``).
* ``delivery_p99_ms``, ``delivery_p95_ms``: 99 % (95 %) of messages acknowledged within that
  many milliseconds of their publish time (a sample of each ack batch, ``sli.record_acks``).
* ``backlog_oldest_age_s``, ``backlog_age_objective``: a freshness objective, the workbook's
  way for a threshold SLI: ``backlog_age_objective`` (0.99) of the time (of the monitor's
  samples), the oldest unacked message of every subscription in scope is at most
  ``backlog_oldest_age_s`` (600) old. Globally it judges the worst subscription of the topics
  that have no backlog objective of their own; a topic table naming either key gets its own
  (the worst of that topic's subscriptions), so each subscription answers to one threshold,
  its topic's, as in ``sli-report`` (which checks the threshold per subscription and minute).
* ``prober_availability``: the share of the probers' probes that succeeded (a probe failing
  for any reason counts against it); global only, the probers use a topic of their own. In
  the process it counts the probes of ``serve --prober-interval`` (none without it: no events,
  never firing); the Prometheus rules count every prober scraped
  (``pubsubd_prober_probes_total``, the ``pubsubd prober`` processes too).
* ``error_rate``: checked by the ``sli-report`` Spark job over a whole window (no burn-rate
  alert).

Alerts follow the SRE workbook's multi-window, multi-burn-rate recipe over a 30-day budget
(:data:`BURN_WINDOWS`): *page* when 2 % of the budget burns in an hour (burn rate 14.4 over
1 h and over the 5 min confirmation window) or 5 % in six hours (6 over 6 h and 30 min).
:class:`SloMonitor` evaluates them in the process from cumulative tallies (``sli.SliCounts``)
sampled every ``SAMPLE_S``, each sample also tallying the backlog ages (one good or bad event
per freshness objective); while the process has run less than a window, the window is what it
has seen. :func:`prometheus_rules` writes the same objectives as Prometheus recording and
alerting rules over the series of ``sli.py``, for a Prometheus that scrapes every process: for
the backlog, a recording rule samples ``max(age) > bool threshold`` of
``pubsubd_topic_oldest_unacked_message_age_seconds`` (``pubsubd:slo_backlog_too_old``, 1 or 0,
every evaluation of its group) and the bad-time ratio over a window is its average there.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pubsubd.observability.sli import (
    BACKLOG,
    LATENCY_BUCKETS,
    PROBE_FAILURE,
    PROBER,
    PROBES_METRIC,
    SERVER_FAULT_CODES,
    SLI_METHODS,
    Indicator,
    SliCounts,
    bucket_index,
)

DEFAULT_SLO: dict[str, float] = {
    "publish_availability": 0.999,
    "pull_availability": 0.999,
    "control_plane_availability": 0.999,
    "publish_p99_ms": 100.0,
    "publish_p95_ms": 50.0,
    "error_rate": 0.01,
    "backlog_oldest_age_s": 600.0,
    "delivery_p99_ms": 5000.0,
    "delivery_p95_ms": 1000.0,
    "backlog_age_objective": 0.99,
    "prober_availability": 0.99,
}
AVAILABILITY_KEYS = (
    "publish_availability",
    "pull_availability",
    "control_plane_availability",
    "prober_availability",
)
# The backlog-age (freshness) objective: the share of samples (BACKLOG_TARGET) in which the
# oldest unacked message is at most BACKLOG_THRESHOLD seconds old; named after its threshold.
BACKLOG_THRESHOLD = "backlog_oldest_age_s"
BACKLOG_TARGET = "backlog_age_objective"
BACKLOG_KEYS = (BACKLOG_THRESHOLD, BACKLOG_TARGET)
RATIO_KEYS = (*AVAILABILITY_KEYS, BACKLOG_TARGET)  # shares: strictly between 0 and 1
# key -> (the SLI, the share of events that must be within the key's threshold)
LATENCY_KEYS = {
    "publish_p99_ms": ("publish", 0.99),
    "publish_p95_ms": ("publish", 0.95),
    "delivery_p99_ms": ("delivery", 0.99),
    "delivery_p95_ms": ("delivery", 0.95),
}
TOPIC_KEYS = frozenset({"publish_availability", *LATENCY_KEYS, *DEFAULT_SLO}) - {
    "pull_availability",
    "control_plane_availability",
    "prober_availability",
}

PERIOD_S = 30 * 86400  # the error budget's period
SAMPLE_S = 15.0


@dataclass(frozen=True, slots=True)
class BurnWindow:
    severity: str
    long_s: float
    short_s: float
    budget_share: float  # of the period's budget, burnt within long_s
    period_s: float = PERIOD_S

    @property
    def factor(self) -> float:
        return self.budget_share * self.period_s / self.long_s


BURN_WINDOWS = (
    BurnWindow("page", 3600, 300, 0.02),  # 14.4
    BurnWindow("page", 6 * 3600, 1800, 0.05),  # 6
)


def scaled_windows(divisor: float) -> tuple[BurnWindow, ...]:
    """BURN_WINDOWS with every duration (the budget period too, so burn thresholds stay)
    divided by ``divisor``: for tests of a real server (``PUBSUBD_TEST_SLO_WINDOW_DIVISOR``)."""
    if divisor == 1:
        return BURN_WINDOWS
    return tuple(
        BurnWindow(
            w.severity,
            w.long_s / divisor,
            w.short_s / divisor,
            w.budget_share,
            w.period_s / divisor,
        )
        for w in BURN_WINDOWS
    )


class SloFileError(ValueError):
    pass


@dataclass(frozen=True)
class SloConfig:
    default: dict[str, float]
    topics: dict[str, dict[str, float]]

    def target(self, name: str, topic: str | None = None) -> float:
        if topic is not None and name in self.topics.get(topic, {}):
            return self.topics[topic][name]
        return self.default[name]


def load_slo(path: Path | None, *, for_alerts: bool = True) -> SloConfig:
    """DEFAULT_SLO overridden by a TOML or JSON file; unknown keys, ratios outside (0, 1), a
    backlog age that is not a positive number of seconds and (``for_alerts``: the server's
    burn-rate objectives count requests per histogram bucket) latency thresholds that are not
    bucket bounds are errors (``SloFileError``). The ``sli-report`` job computes quantiles
    from samples and takes any latency threshold."""
    if path is None:
        return SloConfig(dict(DEFAULT_SLO), {})
    try:
        text = path.read_text()
        raw: dict[str, Any] = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as e:
        raise SloFileError(f"{path}: {e}") from e
    topics_raw = raw.pop("topics", {})
    if not isinstance(topics_raw, dict):
        raise SloFileError(f"{path}: 'topics' must be a table of topic names")

    def clean(d: Any, where: str, allowed: Iterable[str]) -> dict[str, float]:
        if not isinstance(d, dict):
            raise SloFileError(f"{path}: {where} must be a table")
        unknown = set(d) - set(allowed)
        if unknown:
            raise SloFileError(f"{path}: unknown SLO keys {sorted(unknown)} in {where}")
        out: dict[str, float] = {}
        for key, value in d.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise SloFileError(f"{path}: {key} in {where} must be a number")
            value = float(value)
            if key in RATIO_KEYS and not 0.0 < value < 1.0:
                raise SloFileError(f"{path}: {key} in {where} must be between 0 and 1")
            if key == BACKLOG_THRESHOLD and not 0.0 < value < math.inf:
                raise SloFileError(f"{path}: {key} in {where} must be a positive number of seconds")
            if for_alerts and key in LATENCY_KEYS and bucket_index(value / 1000) is None:
                bounds = ", ".join(f"{b * 1000:g}" for b in LATENCY_BUCKETS)
                raise SloFileError(
                    f"{path}: {key} = {value:g} in {where} is not a latency bucket bound "
                    f"(ms: {bounds})"
                )
            out[key] = value
        return out

    return SloConfig(
        {**DEFAULT_SLO, **clean(raw, "the top level", DEFAULT_SLO)},
        {str(t): clean(v, f"topic {t}", TOPIC_KEYS) for t, v in topics_raw.items()},
    )


@dataclass(frozen=True, slots=True)
class Objective:
    """One ratio objective: ``target`` of the indicator's events must be good."""

    name: str  # the SLO file's key
    scope: str  # "global" or a topic name
    indicator: Indicator
    target: float

    @property
    def budget(self) -> float:
        return 1.0 - self.target

    def describe(self) -> str:
        i = self.indicator
        to = "" if i.topic is None else f" to {i.topic}"
        if i.kind == "freshness":
            of = (
                f"of {i.topic}"
                if i.topic is not None
                else "of any topic without its own backlog objective"
                if i.exclude
                else "of any topic"
            )
            return (
                f"{self.target * 100:g}% of the time, no subscription {of} has an unacked message "
                f"older than {i.threshold_s:g} s"
            )
        if i.sli == "delivery":
            return (
                f"{self.target:.0%} of messages{to} acknowledged within "
                f"{i.threshold_s * 1000:g} ms of their publish time (sampled acks)"
            )
        if i.sli == PROBER:
            return f"{self.target:.3%} of the probers' probes succeeded"
        what = f"{i.sli.replace('_', ' ')} requests{to}"
        if i.kind == "availability":
            return f"{self.target:.3%} of {what} not failed by the service"
        return f"{self.target:.0%} of successful {what} within {i.threshold_s * 1000:g} ms"


def backlog_objective(config: SloConfig, topic: str | None) -> Objective:
    """The backlog-age objective of one topic (its keys over the global ones), or the global
    one, which leaves out the topics that have their own."""
    exclude = frozenset() if topic is not None else frozenset(backlog_topics(config))
    indicator = Indicator(
        BACKLOG, "freshness", config.target(BACKLOG_THRESHOLD, topic), topic, exclude
    )
    scope = "global" if topic is None else topic
    return Objective(BACKLOG_THRESHOLD, scope, indicator, config.target(BACKLOG_TARGET, topic))


def backlog_topics(config: SloConfig) -> list[str]:
    """The topics with a backlog-age objective of their own: their table names a backlog key."""
    return sorted(t for t, keys in config.topics.items() if set(keys) & set(BACKLOG_KEYS))


def objectives(config: SloConfig) -> list[Objective]:
    """The burn-rate objectives of a configuration: global, then per topic."""
    out: list[Objective] = []

    def add(key: str, scope: str, topic: str | None, value: float) -> None:
        if key in AVAILABILITY_KEYS:
            sli = key.removesuffix("_availability")
            out.append(Objective(key, scope, Indicator(sli, "availability", topic=topic), value))
        elif key in LATENCY_KEYS:
            sli, share = LATENCY_KEYS[key]
            indicator = Indicator(sli, "latency", value / 1000, topic)
            out.append(Objective(key, scope, indicator, share))

    for key in (*AVAILABILITY_KEYS, *LATENCY_KEYS):
        add(key, "global", None, config.default[key])
    out.append(backlog_objective(config, None))
    own_backlog = set(backlog_topics(config))
    for topic in sorted(config.topics):
        for key, value in config.topics[topic].items():
            add(key, topic, topic, value)
        if topic in own_backlog:
            out.append(backlog_objective(config, topic))
    return out


# -- in the process --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WindowBurn:
    window: BurnWindow
    long_burn: float
    short_burn: float
    long_events: int

    @property
    def firing(self) -> bool:
        f = self.window.factor
        return self.long_burn >= f and self.short_burn >= f


@dataclass(frozen=True, slots=True)
class ObjectiveState:
    objective: Objective
    good: int
    total: int
    burns: tuple[WindowBurn, ...]

    @property
    def budget_remaining(self) -> float | None:
        """The share of the error budget left, counting every event since the process
        started (None before the first event); negative once overspent."""
        if not self.total:
            return None
        bad = (self.total - self.good) / self.total
        return 1.0 - bad / self.objective.budget

    @property
    def firing(self) -> list[WindowBurn]:
        return [b for b in self.burns if b.firing]

    def to_json(self) -> dict[str, Any]:
        o = self.objective
        remaining = self.budget_remaining
        return {
            "slo": o.name,
            "scope": o.scope,
            "objective": o.describe(),
            "target": o.target,
            "good": self.good,
            "total": self.total,
            "sli": None if not self.total else self.good / self.total,
            "error_budget_remaining": None if remaining is None else round(remaining, 6),
            "windows": [
                {
                    "severity": b.window.severity,
                    "long_window": _duration(b.window.long_s),
                    "short_window": _duration(b.window.short_s),
                    "threshold": b.window.factor,
                    "long_burn_rate": round(b.long_burn, 4),
                    "short_burn_rate": round(b.short_burn, 4),
                    "firing": b.firing,
                }
                for b in self.burns
            ],
            "firing": bool(self.firing),
        }


class SloMonitor:
    """Samples the tallies of every objective and evaluates the burn-rate windows; each
    sample also tallies the backlog ages (the freshness objectives' events)."""

    def __init__(
        self,
        config: SloConfig,
        counts: SliCounts,
        *,
        windows: tuple[BurnWindow, ...] = BURN_WINDOWS,
        sample_s: float = SAMPLE_S,
    ) -> None:
        self.config = config
        self.objectives = objectives(config)
        self.counts = counts
        self.windows = windows
        counts.watch(o.indicator for o in self.objectives)
        keep = max(w.long_s for w in windows)
        self._samples: deque[tuple[float, tuple[tuple[int, int], ...]]] = deque(
            maxlen=int(keep / sample_s) + 2
        )

    def _current(self) -> tuple[tuple[int, int], ...]:
        tallies = self.counts.tallies
        return tuple(
            (tallies[o.indicator].good, tallies[o.indicator].total) for o in self.objectives
        )

    def sample(self, now: float, backlog: Iterable[tuple[str, float]] = ()) -> None:
        """Take a sample at ``now``, tallying ``backlog``: the (topic, oldest unacked age in s)
        of every subscription served here. The first sample is preceded by one taken before
        the tally, so that windows reaching back to the start count the first backlog event."""
        if not self._samples:
            self._samples.append((now, self._current()))
        self.counts.record_backlog(backlog)
        self._samples.append((now, self._current()))

    def _at(self, since: float) -> tuple[tuple[int, int], ...] | None:
        """The latest sample taken at or before ``since`` (else the oldest one)."""
        chosen = None
        for t, values in self._samples:
            if t > since and chosen is not None:
                break
            chosen = values
        return chosen

    def evaluate(self, now: float) -> list[ObjectiveState]:
        current = self._current()
        starts = {s: self._at(now - s) for w in self.windows for s in (w.long_s, w.short_s)}
        states = []
        for i, objective in enumerate(self.objectives):
            good, total = current[i]
            burns = []
            for w in self.windows:
                long_burn, events = _burn(objective, current[i], starts[w.long_s], i)
                short_burn, _ = _burn(objective, current[i], starts[w.short_s], i)
                burns.append(WindowBurn(w, long_burn, short_burn, events))
            states.append(ObjectiveState(objective, good, total, tuple(burns)))
        return states

    def alerts(self, now: float) -> dict[str, Any]:
        """The /alerts document: what fires and why, then every objective's state."""
        states = self.evaluate(now)
        firing = [
            {
                "alert": "PubsubdErrorBudgetBurn",
                "severity": b.window.severity,
                "slo": s.objective.name,
                "scope": s.objective.scope,
                "objective": s.objective.describe(),
                "why": (
                    f"burn rate {b.long_burn:.1f} over {_duration(b.window.long_s)} and "
                    f"{b.short_burn:.1f} over {_duration(b.window.short_s)}, both at or above "
                    f"{b.window.factor:g} ({b.window.budget_share:.0%} of the "
                    f"{_period(b.window.period_s)} error budget in "
                    f"{_duration(b.window.long_s)})"
                ),
            }
            for s in states
            for b in s.firing
        ]
        return {"firing": firing, "objectives": [s.to_json() for s in states]}


def _burn(
    objective: Objective,
    now: tuple[int, int],
    start: tuple[tuple[int, int], ...] | None,
    index: int,
) -> tuple[float, int]:
    good0, total0 = (0, 0) if start is None else start[index]
    total = now[1] - total0
    if total <= 0:
        return 0.0, 0
    bad = total - (now[0] - good0)
    return bad / total / objective.budget, total


def _period(seconds: float) -> str:
    """The budget period as prose: ``30-day`` (a shorter, scaled one: its duration)."""
    if seconds >= 86400 and seconds % 86400 == 0:
        return f"{int(seconds // 86400)}-day"
    return _duration(seconds)


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


# -- Prometheus rules ------------------------------------------------------------------------


def _ratio_exprs(objective: Objective, window: str) -> str:
    """PromQL for the objective's bad-event ratio over ``window``."""
    i = objective.indicator
    if i.kind == "freshness":
        return f"avg_over_time({TOO_OLD}{_selector(_labels(objective))}[{window}])"
    if i.sli == PROBER:
        return _probe_failure_ratio(window)
    faults = "|".join(sorted(SERVER_FAULT_CODES))
    if i.sli == "delivery":
        le = _go_float(i.threshold_s)
        sel = "" if i.topic is None else f"topic={json.dumps(i.topic)},"
        count_sel = "" if i.topic is None else f"{{topic={json.dumps(i.topic)}}}"
        return (
            f'1 - sum(rate(pubsubd_delivery_latency_seconds_bucket{{{sel}le="{le}"}}'
            f"[{window}])) / sum(rate(pubsubd_delivery_latency_seconds_count{count_sel}"
            f"[{window}]))"
        )
    if i.topic is None:
        methods = "|".join(sorted(SLI_METHODS[i.sli]))
        if i.kind == "availability":
            sel = f'method=~"{methods}"'
            return (
                f'sum(rate(pubsubd_rpc_requests_total{{{sel},code=~"{faults}"}}[{window}]))'
                f" / sum(rate(pubsubd_rpc_requests_total{{{sel}}}[{window}]))"
            )
        le = _go_float(i.threshold_s)
        sel = f'method=~"{methods}"'
        return (
            f'1 - sum(rate(pubsubd_rpc_latency_seconds_bucket{{{sel},le="{le}"}}[{window}]))'
            f" / sum(rate(pubsubd_rpc_latency_seconds_count{{{sel}}}[{window}]))"
        )
    sel = f"topic={json.dumps(i.topic)}"
    if i.kind == "availability":
        return (
            f'sum(rate(pubsubd_topic_publish_requests_total{{{sel},code=~"{faults}"}}[{window}]))'
            f" / sum(rate(pubsubd_topic_publish_requests_total{{{sel}}}[{window}]))"
        )
    le = _go_float(i.threshold_s)
    return (
        f'1 - sum(rate(pubsubd_topic_publish_latency_seconds_bucket{{{sel},le="{le}"}}'
        f"[{window}])) / sum(rate(pubsubd_topic_publish_latency_seconds_count{{{sel}}}"
        f"[{window}]))"
    )


def _probe_failure_ratio(window: str) -> str:
    """PromQL: failed probes over all probes in ``window``, of every prober scraped; 0 when
    every probe succeeded (no failure series yet), no value at all when no probe ran (the
    denominator's ``> 0`` drops it: no 0/0 NaN)."""
    probes = f"{PROBES_METRIC}_total"
    failed = f'sum(rate({probes}{{result="{PROBE_FAILURE}"}}[{window}]))'
    return f"({failed} or vector(0)) / (sum(rate({probes}[{window}])) > 0)"


BACKLOG_AGE_METRIC = "pubsubd_topic_oldest_unacked_message_age_seconds"
TOO_OLD = "pubsubd:slo_backlog_too_old"  # 1 while a freshness objective's scope is too old


def _too_old_expr(indicator: Indicator) -> str:
    """PromQL: 1 while the worst oldest-unacked age in the indicator's scope is over its
    threshold, else 0 (no series in scope too: nothing waits, as in the process)."""
    if indicator.topic is not None:
        sel = f"{{topic={json.dumps(indicator.topic)}}}"
    elif indicator.exclude:
        sel = f"{{topic!~{json.dumps(_re2_alternatives(indicator.exclude))}}}"
    else:
        sel = ""
    too_old = f"max({BACKLOG_AGE_METRIC}{sel}) > bool {_go_float(indicator.threshold_s)}"
    return f"({too_old}) or vector(0)"


def _re2_alternatives(values: Iterable[str]) -> str:
    """A regular expression (RE2, anchored by Prometheus) matching exactly these strings."""
    special = set("\\.+*?()|[]{}^$")
    return "|".join("".join("\\" + c if c in special else c for c in v) for v in sorted(values))


def _go_float(value: float) -> str:
    """A float as prometheus_client writes bucket bounds (``le="0.1"``, ``le="1.0"``)."""
    return repr(float(value))


def _labels(objective: Objective) -> dict[str, str]:
    return {"slo": objective.name, "scope": objective.scope}


def _selector(labels: dict[str, str]) -> str:
    return "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in labels.items()) + "}"


def prometheus_rules(config: SloConfig) -> dict[str, Any]:
    """Recording rules ``pubsubd:slo_error_ratio:rate<window>{slo, scope}`` for every
    objective and window (a backlog objective's: the average over the window of its
    ``pubsubd:slo_backlog_too_old``, recorded first), and one alerting rule per objective and
    burn window."""
    objs = objectives(config)
    windows = sorted({s for w in BURN_WINDOWS for s in (w.long_s, w.short_s)})
    samples = [
        {"record": TOO_OLD, "expr": _too_old_expr(o.indicator), "labels": _labels(o)}
        for o in objs
        if o.indicator.kind == "freshness"
    ]
    recording = samples + [
        {
            "record": f"pubsubd:slo_error_ratio:rate{_duration(s)}",
            "expr": _ratio_exprs(o, _duration(s)),
            "labels": _labels(o),
        }
        for o in objs
        for s in windows
    ]
    alerting = []
    for o in objs:
        sel = _selector(_labels(o))
        for w in BURN_WINDOWS:
            threshold = f"{w.factor:g} * {_go_float(round(o.budget, 12))}"
            long_name = f"pubsubd:slo_error_ratio:rate{_duration(w.long_s)}"
            short_name = f"pubsubd:slo_error_ratio:rate{_duration(w.short_s)}"
            alerting.append(
                {
                    "alert": "PubsubdErrorBudgetBurn",
                    "expr": (
                        f"{long_name}{sel} > ({threshold}) and {short_name}{sel} > ({threshold})"
                    ),
                    "labels": {
                        **_labels(o),
                        "severity": w.severity,
                        "long_window": _duration(w.long_s),
                    },
                    "annotations": {
                        "summary": f"{o.name} ({o.scope}) burns its error budget",
                        "description": (
                            f"{o.describe()}: {w.budget_share:.0%} of the 30-day budget "
                            f"would be spent within {_duration(w.long_s)} (burn rate above "
                            f"{w.factor:g} over {_duration(w.long_s)} and "
                            f"{_duration(w.short_s)})"
                        ),
                    },
                }
            )
    return {
        "groups": [
            {"name": "pubsubd-slo-recording", "interval": "30s", "rules": recording},
            {"name": "pubsubd-slo-alerts", "interval": "30s", "rules": alerting},
        ]
    }


def to_yaml(value: Any, indent: int = 0) -> str:
    """A small YAML writer for the rules' plain shapes (maps, lists, strings, numbers);
    strings are written double-quoted with JSON escapes, which YAML reads alike."""
    pad = "  " * indent
    if isinstance(value, dict):
        if not value:
            return "{}\n"
        lines = []
        for k, v in value.items():
            if isinstance(v, dict | list) and v:
                lines.append(f"{pad}{k}:\n{to_yaml(v, indent + 1)}")
            else:
                lines.append(f"{pad}{k}: {to_yaml(v).strip()}\n")
        return "".join(lines)
    if isinstance(value, list):
        if not value:
            return "[]\n"
        out = []
        for item in value:
            body = to_yaml(item, indent + 1)
            out.append(f"{pad}- {body.lstrip()}")
        return "".join(out)
    if isinstance(value, bool):
        return "true\n" if value else "false\n"
    if isinstance(value, int | float):
        return f"{value}\n" if math.isfinite(value) else '".nan"\n'
    return json.dumps(str(value)) + "\n"
