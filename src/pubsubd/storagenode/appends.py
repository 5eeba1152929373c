"""One streamed append, answered: what ``AppendStream`` (service.py) and the append port
(append_port.py) both do with an ``AppendStreamRequest``. A refusal becomes the answer's code,
message and metadata through :func:`~pubsubd.storagenode.service.refusal`'s map, the same a
unary ``Append`` sends as its status and trailing metadata.

:func:`start_append` hands the append to the store at once and calls back with the answer in
the step where the store settles it (its group commit): no task per append and no event-loop
turn between the commit and the answer (the append port's way). :func:`answer_append` awaits
the same."""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from pubsubd._gen.pubsubd.internal.v1 import storage_pb2 as pb
from pubsubd.core.errors import PubsubError
from pubsubd.storagenode.errors import UnsupportedVersion
from pubsubd.storagenode.ledger_store import LedgerStore
from pubsubd.storagenode.protocol import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION
from pubsubd.storagenode.refusals import refusal

log = logging.getLogger(__name__)

__all__ = ["answer_append", "check_version", "start_append"]


def check_version(version: int) -> None:
    if not MIN_PROTOCOL_VERSION <= version <= PROTOCOL_VERSION:
        raise UnsupportedVersion(version, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION)


def _answer(
    request_id: int, end_offset: int | None, error: BaseException | None
) -> pb.AppendStreamResponse:
    answer = pb.AppendStreamResponse(request_id=request_id)
    if error is None:
        assert end_offset is not None
        answer.end_offset = end_offset
    elif isinstance(error, PubsubError):
        code, md = refusal(error)
        answer.code, answer.message = code.value[0], str(error)
        answer.metadata.update(md)
    else:
        log.error("append failed", exc_info=error)
        answer.code = grpc.StatusCode.INTERNAL.value[0]
        answer.message = f"internal error: {type(error).__name__}"
    return answer


def start_append(
    store: LedgerStore,
    request: pb.AppendStreamRequest,
    answered: Callable[[pb.AppendStreamResponse], None],
) -> None:
    """Queue ``request``'s append in the store (in call order, so a ledger's appends reach it
    in the order they arrived) and call ``answered`` with its answer once it is settled:
    at once for a refusal, else from the group commit that makes it durable or refuses it."""
    a = request.append
    request_id = request.request_id

    def settled(end_offset: int | None, error: BaseException | None) -> None:
        answered(_answer(request_id, end_offset, error))

    try:
        check_version(a.protocol_version)
        store.start_append(
            a.ledger_id, a.epoch, a.first_offset, a.frames, a.last_add_confirmed, settled
        )
    except Exception as exc:
        answered(_answer(request_id, None, exc))


async def answer_append(
    store: LedgerStore, request: pb.AppendStreamRequest
) -> pb.AppendStreamResponse:
    a = request.append
    try:
        check_version(a.protocol_version)
        end = await store.append(
            a.ledger_id, a.epoch, a.first_offset, a.frames, a.last_add_confirmed
        )
    except Exception as exc:
        return _answer(request.request_id, None, exc)
    return _answer(request.request_id, end, None)
