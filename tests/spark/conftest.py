"""One SparkSession for the whole test session (about 7 s to start)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# No skips: `make test` installs pyspark and pyarrow, and every machine has Java 17, so a
# missing piece must fail the suite instead of hiding the Spark tests.
import pyarrow  # noqa: F401
import pyspark  # noqa: F401
import pytest

from tests.spark.session import local_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = local_session()
    yield session
    session.stop()
