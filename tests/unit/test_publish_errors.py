"""What a client hears when a topic log's append fails: storage out of reach (storage nodes,
ZooKeeper, a fenced writer, an expired session) is UNAVAILABLE, so the official client retries
and may go to another server; anything else is INTERNAL."""

from __future__ import annotations

from pathlib import Path

import pytest

from pubsubd.coordination.errors import SessionExpired
from pubsubd.core import pb
from pubsubd.core.errors import InternalError, PubsubError, Unavailable
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.storage.errors import Fenced, ReplicationFailed, StorageError
from pubsubd.storage.log import SourceLog

pytestmark = pytest.mark.unit


def _request() -> bytes:
    return pb.PublishRequest(topic="t", messages=[pb.PubsubMessage(data=b"x")]).SerializeToString()


@pytest.mark.parametrize(
    ("cause", "answer"),
    [
        (ReplicationFailed("2 of 3 storage nodes did not answer"), Unavailable),
        (Fenced("ledger 7 fenced by a newer writer"), Unavailable),
        (SessionExpired("ZooKeeper session expired", "/pubsubd/sources/1/x/0"), Unavailable),
        (OSError(5, "Input/output error"), InternalError),
    ],
    ids=["replication", "fenced", "session-expired", "io-error"],
)
async def test_an_append_failure_is_unavailable_only_when_storage_is_out_of_reach(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cause: BaseException,
    answer: type[PubsubError],
) -> None:
    async def failing_append(*_args: object, **_kwargs: object) -> int:
        error = StorageError(f"append failed: {cause}")
        error.__cause__ = cause
        raise error

    publishing = PublishingForwarder(tmp_path)
    try:
        assert await publishing.publish("t", _request(), 1) == (0, 0)
        monkeypatch.setattr(SourceLog, "append", failing_append)
        with pytest.raises(PubsubError) as raised:
            await publishing.publish("t", _request(), 1)
        assert type(raised.value) is answer, raised.value
        assert str(cause) in str(raised.value)
    finally:
        await publishing.close()
