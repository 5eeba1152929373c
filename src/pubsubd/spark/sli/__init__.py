"""``pubsubd sli-report``: the SLI analytics job over the server's monitoring events.

Reads ``projects/_pubsubd/topics/sli-events`` (observability/events.py) through the ``pubsubd``
connector in batch, and writes under ``--out``:

* ``publish_minute/`` (Parquet, partitioned by ``date``): per topic and minute, publish calls,
  failures, error rate, p50/p95/p99 latency (``percentile_approx``) and ``latency_sketch``, a KLL
  sketch (``kll_sketch_agg_double``) that merges exactly into hourly or daily figures;
* ``publish_hour/``: the hourly roll-up, built by merging the minute sketches
  (``kll_merge_agg_double`` + ``kll_sketch_get_quantile_double``), never from percentiles;
* ``errors_minute/``: errors per minute, RPC method and gRPC code;
* ``backlog_minute/``: per subscription and minute, max and last backlog and oldest unacked age;
* ``delivery_minute/`` (partitioned by ``date``): per subscription (and its topic) and minute,
  messages acked and p50/p95/p99 end-to-end delivery latency (publish time to ack) with its KLL
  sketch; ``delivery_hour/``: the hourly roll-up from merged sketches;
* ``slo/``: one row per SLO check with PASS or FAIL;
* ``report.html``: one self-contained page (inline SVG, no scripts): the verdicts first, then
  p99 publish latency, p99 delivery latency, error rate and backlog age over time against their
  targets.

``--follow`` runs the same job as a streaming query (``stream``): checkpointed under ``--out``,
restartable without double counting, refreshing the tables and the report at each micro-batch.
The minute tables and the report's totals also carry volume-weighted quantiles
(``weighted_p50_ms`` .. ``weighted_p99_ms``, module ``quantiles``): each interval's samples
weighted by its calls or acked messages.

Modules: ``jobs`` (the Spark computations and the job itself), ``slo`` (targets and verdicts,
pure), ``report`` (the HTML page from the ``report.html`` template). SLO targets default to
:data:`DEFAULT_SLO`; ``--slo FILE`` (TOML or JSON) overrides them, globally at the top level and
per topic under ``[topics."projects/p/topics/t"]``.
"""

from __future__ import annotations

from pubsubd.spark.sli.jobs import Result, main, refresh, run
from pubsubd.spark.sli.quantiles import weighted_quantile
from pubsubd.spark.sli.report import render_html
from pubsubd.spark.sli.slo import DEFAULT_SLO, Check, SloConfig, evaluate, load_slo
from pubsubd.spark.sli.stream import Progress, follow, follow_main

__all__ = [
    "DEFAULT_SLO",
    "Check",
    "Progress",
    "Result",
    "SloConfig",
    "evaluate",
    "follow",
    "follow_main",
    "load_slo",
    "main",
    "refresh",
    "render_html",
    "run",
    "weighted_quantile",
]
