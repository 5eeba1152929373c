"""Unit tests for majority bookkeeping (pubsubd.storage.quorum)."""

from __future__ import annotations

import asyncio

import pytest

from pubsubd.storage.errors import ReplicationFailed
from pubsubd.storage.quorum import QuorumTracker, majority
from pubsubd.storage.replication import QuorumWriter

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("replicas", [0, -1, 2, 4])
def test_rejects_even_or_empty(replicas: int) -> None:
    with pytest.raises(ValueError):
        QuorumTracker(replicas)


def test_majority_sizes() -> None:
    assert [majority(n) for n in (1, 3, 5, 7)] == [1, 2, 3, 4]


def test_single_replica_commits_its_acks() -> None:
    tracker = QuorumTracker(1)
    assert tracker.committed() == 0
    tracker.ack(0, 3)
    assert tracker.committed() == 3


def test_three_replicas_need_two() -> None:
    tracker = QuorumTracker(3)
    tracker.ack(0, 5)
    assert tracker.committed() == 0
    tracker.ack(2, 3)
    assert tracker.committed() == 3
    tracker.ack(1, 7)
    assert tracker.committed() == 5
    tracker.ack(1, 2)  # stale acks never move a replica backwards
    assert tracker.acked(1) == 7 and tracker.committed() == 5


def test_five_replicas() -> None:
    tracker = QuorumTracker(5)
    for index, seq in enumerate([9, 1, 4, 4, 0]):
        tracker.ack(index, seq)
    assert tracker.majority == 3 and tracker.committed() == 4


def test_bad_index() -> None:
    with pytest.raises(IndexError):
        QuorumTracker(3).ack(3, 1)


class _FakeReplica:
    """In-memory replica: records appended data; can fail or stall on demand."""

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.data: list[bytes] = []
        self.gate: asyncio.Event | None = None
        self.closed = False

    async def append(self, segment_base: int, data: bytes, sync: bool) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise OSError("disk on fire")
        self.data.append(data)

    async def sync(self) -> None:
        if self.fail:
            raise OSError("disk on fire")

    async def roll(self, new_segment_base: int, sync: bool) -> None:
        if self.fail:
            raise OSError("disk on fire")

    def delete_segment(self, segment_base: int) -> None:
        if self.fail:
            raise OSError("disk on fire")

    async def close(self) -> None:
        self.closed = True


async def test_quorum_writer_tolerates_a_minority_failure() -> None:
    replicas = [_FakeReplica(), _FakeReplica(fail=True), _FakeReplica()]
    writer = QuorumWriter(replicas)
    await writer.append(0, b"a", True)
    await writer.append(0, b"b", True)
    writer.delete_segment(0)
    assert writer.failed_replicas == {1}
    assert replicas[0].data == replicas[2].data == [b"a", b"b"]
    await writer.close()
    assert all(r.closed for r in replicas)


async def test_quorum_writer_fails_without_a_majority() -> None:
    writer = QuorumWriter([_FakeReplica(fail=True), _FakeReplica(), _FakeReplica(fail=True)])
    with pytest.raises(ReplicationFailed):
        await writer.append(0, b"a", True)
    with pytest.raises(ReplicationFailed):
        await writer.sync()


async def test_quorum_writer_does_not_wait_for_a_slow_replica() -> None:
    replicas = [_FakeReplica(), _FakeReplica(), _FakeReplica()]
    replicas[0].gate = asyncio.Event()
    writer = QuorumWriter(replicas)
    await asyncio.wait_for(writer.append(0, b"a", True), 1)
    await asyncio.wait_for(writer.append(0, b"b", True), 1)
    assert replicas[0].data == []
    replicas[0].gate.set()
    await writer.close()
    assert replicas[0].data == [b"a", b"b"]  # applied in order once unblocked


async def test_single_replica_failure_is_replication_failed() -> None:
    writer = QuorumWriter([_FakeReplica(fail=True)])
    with pytest.raises(ReplicationFailed):
        await writer.roll(5, True)
