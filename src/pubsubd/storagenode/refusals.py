"""THE map from a storage node's domain errors to a gRPC status and the trailing metadata a
caller reads instead of the message (``storage/node_client.py`` turns it back into typed
errors). Unary calls send it as their status; streamed appends as their answer's fields."""

from __future__ import annotations

from typing import TypeAlias

import grpc

from pubsubd.core.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PubsubError,
    ResourceExhausted,
    Unavailable,
)
from pubsubd.storage import node_client as nc
from pubsubd.storagenode.errors import (
    AppendGap,
    DisksFull,
    FencedAppend,
    NodeStopping,
    OverlapMismatch,
    TooFewDisks,
    UnsupportedVersion,
)

__all__ = ["Metadata", "refusal"]

Metadata: TypeAlias = tuple[tuple[str, str], ...]


def refusal(exc: PubsubError) -> tuple[grpc.StatusCode, Metadata]:
    """The status and trailing metadata that tell a caller what ``exc`` is."""
    md: list[tuple[str, str]] = []
    if isinstance(exc, UnsupportedVersion):
        code, reason = grpc.StatusCode.FAILED_PRECONDITION, nc.REASON_PROTOCOL
        md += [(nc.MD_MIN_VERSION, str(exc.min_version)), (nc.MD_MAX_VERSION, str(exc.max_version))]
    elif isinstance(exc, FencedAppend):
        code, reason = grpc.StatusCode.FAILED_PRECONDITION, nc.REASON_FENCED
        md.append((nc.MD_FENCED_EPOCH, str(exc.fenced_epoch)))
    elif isinstance(exc, AppendGap):
        code, reason = grpc.StatusCode.FAILED_PRECONDITION, nc.REASON_GAP
        md.append((nc.MD_END_OFFSET, str(exc.node_end)))
    elif isinstance(exc, OverlapMismatch):
        code, reason = grpc.StatusCode.FAILED_PRECONDITION, nc.REASON_MISMATCH
        md.append((nc.MD_END_OFFSET, str(exc.node_end)))
    elif isinstance(exc, DisksFull):
        code, reason = grpc.StatusCode.RESOURCE_EXHAUSTED, nc.REASON_DISK_FULL
    elif isinstance(exc, TooFewDisks):
        code, reason = grpc.StatusCode.UNAVAILABLE, nc.REASON_TOO_FEW_DISKS
    elif isinstance(exc, NodeStopping):
        code, reason = grpc.StatusCode.UNAVAILABLE, nc.REASON_STOPPING
    elif isinstance(exc, InvalidArgument):
        code, reason = grpc.StatusCode.INVALID_ARGUMENT, ""
    elif isinstance(exc, NotFound):
        code, reason = grpc.StatusCode.NOT_FOUND, ""
    elif isinstance(exc, FailedPrecondition):
        code, reason = grpc.StatusCode.FAILED_PRECONDITION, ""
    elif isinstance(exc, ResourceExhausted):
        code, reason = grpc.StatusCode.RESOURCE_EXHAUSTED, ""
    elif isinstance(exc, Unavailable):
        code, reason = grpc.StatusCode.UNAVAILABLE, ""
    else:
        code, reason = grpc.StatusCode.INTERNAL, ""
    if reason:
        md.insert(0, (nc.MD_REASON, reason))
    return code, tuple(md)
