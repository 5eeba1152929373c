"""A local Spark session with the fast, stable test settings (shared by tests and job scripts)."""

from __future__ import annotations

import os
import sys
from typing import Any


def spark_env() -> None:
    """Workers must run this interpreter (it has pyarrow and pubsubd); bind to loopback only."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ.pop("PUBSUB_EMULATOR_HOST", None)


def local_session(app: str = "pubsubd-tests") -> Any:
    spark_env()
    from pyspark.sql import SparkSession

    from pubsubd.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
