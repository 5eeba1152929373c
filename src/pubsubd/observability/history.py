"""Recent history for the dashboard's charts (pure): a ring of samples, each the wall-clock
time and a flat ``{key: value}`` of cumulative counters and gauges, taken every few seconds
by the serving process (``dashboard.py``), so a page shows the last minutes at first load.

Counters become per-second rates between consecutive samples (:meth:`History.rates`; a counter
that went down, a restart of its source, gives no rate), gauges are read as they are
(:meth:`History.values`). A key missing from a sample is a gap (``None``) in its series.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

INTERVAL_S = 5.0
KEEP_S = 900.0  # 15 minutes


class History:
    def __init__(self, interval_s: float = INTERVAL_S, keep_s: float = KEEP_S) -> None:
        self.interval_s = interval_s
        self._samples: deque[tuple[float, dict[str, float]]] = deque(
            maxlen=int(keep_s / interval_s) + 1
        )

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, t: float, values: Mapping[str, float]) -> None:
        self._samples.append((t, dict(values)))

    def samples(self) -> list[tuple[float, dict[str, float]]]:
        return list(self._samples)

    def times(self) -> list[float]:
        return [t for t, _ in self._samples]

    def values(self, key: str) -> list[float | None]:
        """The gauge ``key`` at every sample."""
        return [v.get(key) for _, v in self._samples]

    def rates(self, key: str) -> list[float | None]:
        """The counter ``key``'s rate per second from the previous sample to each sample (the
        first sample has none)."""
        out: list[float | None] = []
        previous: tuple[float, dict[str, float]] | None = None
        for t, v in self._samples:
            out.append(None if previous is None else _rate(previous, (t, v), key))
            previous = (t, v)
        return out

    def latest(self) -> tuple[float, dict[str, float]] | None:
        return self._samples[-1] if self._samples else None

    def at_or_before(self, t: float) -> tuple[float, dict[str, float]] | None:
        """The latest sample taken at or before ``t``, else the oldest one."""
        chosen = None
        for sample in self._samples:
            if sample[0] > t and chosen is not None:
                break
            chosen = sample
        return chosen

    def rate(self, key: str, window_s: float) -> float | None:
        """The counter ``key``'s rate per second over (about) the last ``window_s``: from the
        sample at or before ``latest - window_s`` to the latest one."""
        last = self.latest()
        if last is None:
            return None
        first = self.at_or_before(last[0] - window_s)
        if first is None or first is last:
            return None
        return _rate(first, last, key)

    def delta(self, key: str, window_s: float) -> float | None:
        """How much the counter ``key`` grew over (about) the last ``window_s``."""
        last = self.latest()
        first = None if last is None else self.at_or_before(last[0] - window_s)
        if last is None or first is None or first is last:
            return None
        a, b = first[1].get(key), last[1].get(key)
        return None if a is None or b is None or b < a else b - a


def _rate(
    a: tuple[float, dict[str, float]], b: tuple[float, dict[str, float]], key: str
) -> float | None:
    (t0, v0), (t1, v1) = a, b
    x0, x1 = v0.get(key), v1.get(key)
    if x0 is None or x1 is None or t1 <= t0 or x1 < x0:
        return None
    return (x1 - x0) / (t1 - t0)


def growth(before: Sequence[float] | None, after: Sequence[float]) -> list[float]:
    """What cumulative histogram ``counts`` gained from ``before`` to ``after`` (bucket by
    bucket, never below 0); all of ``after`` when there was nothing before."""
    if before is None:
        return list(after)
    return [max(0.0, a - b) for a, b in zip(after, before, strict=True)]


def quantile(bounds: list[float], counts: list[float], q: float) -> float | None:
    """The ``q`` quantile of a histogram given as cumulative ``counts`` at upper ``bounds``
    (Prometheus buckets, +Inf excluded; ``counts`` may carry one more, the total): the bound
    of the first bucket reaching ``q`` of the total, an upper estimate; None if empty, inf if
    it lies beyond the last bound."""
    total = counts[-1] if len(counts) > len(bounds) else (counts[-1] if counts else 0)
    if not total:
        return None
    for bound, count in zip(bounds, counts, strict=False):
        if count >= q * total:
            return bound
    return float("inf")
