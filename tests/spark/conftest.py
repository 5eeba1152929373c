"""One SparkSession for the whole test session (about 7 s to start)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

# No skips: `make test` installs pyspark and pyarrow, and every machine has Java 17, so a
# missing piece must fail the suite instead of hiding the Spark tests.
import pyarrow  # noqa: F401
import pyspark  # noqa: F401
import pytest
from pyspark.errors import PySparkRuntimeError

from tests.spark.session import local_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    try:
        session = local_session()
    except PySparkRuntimeError as e:
        # Seen once in CI after the integration suite: the JVM exited silently before it sent
        # its gateway port (not reproduced since). Try a second launch, and say so.
        if "JAVA_GATEWAY_EXITED" not in str(e):
            raise
        print(f"Spark's JVM did not start ({e}); retrying once", file=sys.stderr)
        time.sleep(2)
        session = local_session()
    yield session
    session.stop()
