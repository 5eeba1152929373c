"""One streamed append, answered: what ``AppendStream`` (service.py) and the append port
(append_port.py) both do with an ``AppendStreamRequest``. A refusal becomes the answer's code,
message and metadata through :func:`~pubsubd.storagenode.service.refusal`'s map, the same a
unary ``Append`` sends as its status and trailing metadata."""

from __future__ import annotations

import logging

import grpc

from pubsubd._gen.pubsubd.internal.v1 import storage_pb2 as pb
from pubsubd.core.errors import PubsubError
from pubsubd.storagenode.errors import UnsupportedVersion
from pubsubd.storagenode.ledger_store import LedgerStore
from pubsubd.storagenode.protocol import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION
from pubsubd.storagenode.refusals import refusal

log = logging.getLogger(__name__)

__all__ = ["answer_append", "check_version"]


def check_version(version: int) -> None:
    if not MIN_PROTOCOL_VERSION <= version <= PROTOCOL_VERSION:
        raise UnsupportedVersion(version, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION)


async def answer_append(
    store: LedgerStore, request: pb.AppendStreamRequest
) -> pb.AppendStreamResponse:
    a = request.append
    answer = pb.AppendStreamResponse(request_id=request.request_id)
    try:
        check_version(a.protocol_version)
        answer.end_offset = await store.append(
            a.ledger_id, a.epoch, a.first_offset, a.frames, a.last_add_confirmed
        )
    except PubsubError as exc:
        code, md = refusal(exc)
        answer.code, answer.message = code.value[0], str(exc)
        answer.metadata.update(md)
    except Exception as exc:
        log.exception("append failed")
        answer.code = grpc.StatusCode.INTERNAL.value[0]
        answer.message = f"internal error: {type(exc).__name__}"
    return answer
