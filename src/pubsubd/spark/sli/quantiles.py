"""Volume-weighted latency quantiles: each interval's samples weighted by its message count.

An SLI event carries a uniform sample of at most ``MAX_SAMPLES`` latencies of its interval
(observability/events.py), so a plain quantile over the samples gives a quiet interval (3 calls,
3 samples) the same say as a busy one (50,000 calls, 200 samples). Weighting every sample by
``volume / samples`` of its event makes the quantile the one of the messages (or calls) behind
the samples. The definition, shared by :func:`weighted_quantile` (pure, the reference) and
:func:`weighted_quantiles` (the Spark form): the smallest sample ``x`` whose cumulative weight
(samples sorted by value, ties together) reaches ``q`` of the total weight.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

QUANTILES = (0.5, 0.95, 0.99)
_EPS = 1e-9  # relative slack for float sums of weights


def weighted_quantile(values: Sequence[float], weights: Sequence[float], q: float) -> float | None:
    """The weighted ``q`` quantile of ``values`` (None if nothing has weight)."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    if len(values) != len(weights):
        raise ValueError("values and weights differ in length")
    pairs = sorted((v, w) for v, w in zip(values, weights, strict=True) if w > 0)
    total = sum(w for _, w in pairs)
    if total <= 0:
        return None
    need = q * total - _EPS * total
    cum = 0.0
    i = 0
    while i < len(pairs):  # a run of equal values counts as one step
        v = pairs[i][0]
        while i < len(pairs) and pairs[i][0] == v:
            cum += pairs[i][1]
            i += 1
        if cum >= need:
            return v
    return pairs[-1][0]


def weighted_samples(events: Any, kind: str, keys: Sequence[str], volume: Any) -> Any:
    """One row per latency sample of ``kind`` events: ``keys``, ``lat`` and its weight ``w``
    (the event's ``volume`` column expression spread evenly over its samples)."""
    from pyspark.sql import functions as F

    rows = events.where((F.col("kind") == kind) & (F.size("latency_ms") > 0)).select(
        *keys,
        (volume.cast("double") / F.size("latency_ms")).alias("w"),
        F.explode("latency_ms").alias("lat"),
    )
    return rows.where(F.col("w") > 0)


def weighted_quantiles(
    samples: Any, keys: Sequence[str], quantiles: Sequence[float] = QUANTILES
) -> Any:
    """Per ``keys``: ``weighted_p50_ms`` etc. from :func:`weighted_samples` rows (exact, by
    cumulative weight over a window; the same definition as :func:`weighted_quantile`)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    group = Window.partitionBy(*keys)
    upto = group.orderBy("lat")  # RANGE frame: equal values share their cumulative weight
    ranked = samples.select(
        *keys,
        "lat",
        F.sum("w").over(upto).alias("cum"),
        F.sum("w").over(group).alias("total"),
    )
    return ranked.groupBy(*keys).agg(
        *(
            F.min(F.when(F.col("cum") >= F.col("total") * (q - _EPS), F.col("lat"))).alias(
                f"weighted_p{_label(q)}_ms"
            )
            for q in quantiles
        )
    )


def _label(q: float) -> str:
    return f"{q * 100:g}".replace(".", "_")
