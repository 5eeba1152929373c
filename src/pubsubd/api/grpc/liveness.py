"""Asking an address who serves there (``pubsubd.internal.v1.Forwarder/Identify``), to tell a
dead forwarder before its ZooKeeper session expires (rules: ``core/liveness.py``).

A fresh channel per question, so a channel's reconnect backoff never answers for the process
now at the address; the answer comes within ``timeout_s`` (a refused connection in ~1 ms on
loopback).
"""

from __future__ import annotations

import grpc

from pubsubd._gen.pubsubd.internal.v1 import forwarder_pb2 as f
from pubsubd.api.grpc.forwarder_service import IDENTIFY, PROTOCOL_VERSION
from pubsubd.core.liveness import Liveness, probe_verdict
from pubsubd.storage.node_client import new_channel

PROBE_TIMEOUT_S = 1.0


async def identify(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> f.IdentifyResponse:
    """Ask ``address`` who it is; raises ``grpc.aio.AioRpcError``."""
    async with new_channel(address) as channel:
        call = channel.unary_unary(
            IDENTIFY,
            request_serializer=f.IdentifyRequest.SerializeToString,
            response_deserializer=f.IdentifyResponse.FromString,
        )
        response: f.IdentifyResponse = await call(
            f.IdentifyRequest(protocol_version=PROTOCOL_VERSION), timeout=timeout_s
        )
        return response


async def probe(
    address: str, owner_session: int, timeout_s: float = PROBE_TIMEOUT_S
) -> tuple[Liveness, str]:
    """Whether the process holding ZooKeeper session ``owner_session`` still serves at
    ``address``, and why (a ``coordination.liveness.AddressProbe``)."""
    try:
        answer = await identify(address, timeout_s)
    except grpc.aio.AioRpcError as e:
        details = e.details() or e.code().name
        verdict = probe_verdict(details, None, owner_session)
        return verdict, f"{address}: {e.code().name}: {details}"
    verdict = probe_verdict(None, answer.session_id, owner_session)
    return verdict, f"{address} answers with ZooKeeper session {answer.session_id:#x}"
