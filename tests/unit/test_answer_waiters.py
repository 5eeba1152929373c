"""The append answers' waiters (storage/node_client.AnswerWaiters): a callback waiter is
called in the reader's own step, once, by its answer, its deadline or the stream's end."""

from __future__ import annotations

import asyncio

import grpc

from pubsubd._gen.pubsubd.internal.v1 import storage_pb2 as pb
from pubsubd.storage.node_client import (
    MD_FENCED_EPOCH,
    MD_REASON,
    REASON_FENCED,
    AnswerWaiters,
    LedgerFenced,
    NodeUnavailable,
)


def _recorder() -> tuple[list[tuple[int | None, BaseException | None]], object]:
    told: list[tuple[int | None, BaseException | None]] = []

    def answered(end: int | None, error: BaseException | None) -> None:
        told.append((end, error))

    return told, answered


async def test_a_callback_is_called_by_settle_itself_once() -> None:
    waiters = AnswerWaiters("node:1")
    told, answered = _recorder()
    request_id = waiters.add_callback(5.0, answered)  # type: ignore[arg-type]
    waiters.settle(pb.AppendStreamResponse(request_id=request_id, end_offset=7))
    assert told == [(7, None)]  # no event-loop turn needed
    waiters.settle(pb.AppendStreamResponse(request_id=request_id, end_offset=8))  # a duplicate
    waiters.fail_all(NodeUnavailable("node:1", None, "ended"))
    assert told == [(7, None)]


async def test_a_refusal_is_typed_and_the_end_fails_the_rest() -> None:
    waiters = AnswerWaiters("node:1")
    told, answered = _recorder()
    fenced = waiters.add_callback(5.0, answered)  # type: ignore[arg-type]
    waiters.add_callback(5.0, answered)  # type: ignore[arg-type]
    waiters.settle(
        pb.AppendStreamResponse(
            request_id=fenced,
            code=grpc.StatusCode.FAILED_PRECONDITION.value[0],
            message="fenced",
            metadata={MD_REASON: REASON_FENCED, MD_FENCED_EPOCH: "9"},
        )
    )
    waiters.fail_all(NodeUnavailable("node:1", None, "ended"))
    assert [end for end, _ in told] == [None, None]
    assert isinstance(told[0][1], LedgerFenced) and told[0][1].fenced_epoch == 9
    assert isinstance(told[1][1], NodeUnavailable)


async def test_a_deadline_fails_a_callback_and_a_future_alike() -> None:
    waiters = AnswerWaiters("node:1")
    told, answered = _recorder()
    waiters.add_callback(0.01, answered)  # type: ignore[arg-type]
    request_id, future = waiters.add(0.01)
    await asyncio.sleep(0.05)
    assert len(told) == 1 and isinstance(told[0][1], NodeUnavailable)
    assert told[0][1].code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert isinstance(future.exception(), NodeUnavailable)
    waiters.remove(request_id)
