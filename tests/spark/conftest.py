"""One SparkSession for the whole test session (about 7 s to start)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip(
        "Spark needs Java 17 or 21 (java not on PATH, JAVA_HOME unset)", allow_module_level=True
    )

from tests.spark.session import local_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = local_session()
    yield session
    session.stop()
