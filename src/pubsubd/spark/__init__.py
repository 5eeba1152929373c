"""PySpark connector for pubsubd (optional extra ``pubsubd[spark]``): format ``pubsubd``.

Pure Python on PySpark's Python Data Source API (PySpark >= 4.2), no jars::

    from pubsubd.spark import PubsubdDataSource
    spark.dataSource.register(PubsubdDataSource)   # or pubsubd.spark.register(spark)
    df = (spark.readStream.format("pubsubd")
          .option("endpoint", "127.0.0.1:8085")
          .option("topic", "projects/p/topics/orders")
          .load())

See ``source.py`` (streaming and batch readers) and ``sink.py`` (publishing writers).
"""

from __future__ import annotations

from typing import Any

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pubsubd.spark needs PySpark and pyarrow: pip install 'pubsubd[spark]'"
    ) from exc

from pubsubd.spark.source import PubsubdDataSource


def register(spark: Any) -> None:
    """Register ``format("pubsubd")`` in a SparkSession (once per session)."""
    spark.dataSource.register(PubsubdDataSource)


__all__ = ["PubsubdDataSource", "register"]
