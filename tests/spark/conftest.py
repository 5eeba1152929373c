"""One SparkSession for the whole test session (about 7 s to start)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from tests.spark.session import local_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = local_session()
    yield session
    session.stop()
