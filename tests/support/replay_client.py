"""A minimal client of pubsubd.v1.Replay for tests (plain grpc channel, generated messages)."""

from __future__ import annotations

from typing import Any

import grpc

from pubsubd._gen.pubsubd.v1 import replay_pb2 as r

_METHODS = {
    "GetTopicRanges": (r.GetTopicRangesRequest, r.GetTopicRangesResponse),
    "LookupOffsets": (r.LookupOffsetsRequest, r.LookupOffsetsResponse),
    "Read": (r.ReadRequest, r.ReadResponse),
    "GetCursor": (r.GetCursorRequest, r.Cursor),
    "CommitCursor": (r.CommitCursorRequest, r.Cursor),
    "PublishDeduplicated": (r.PublishDeduplicatedRequest, r.PublishDeduplicatedResponse),
    "ListCursors": (r.ListCursorsRequest, r.ListCursorsResponse),
    "DeleteCursor": (r.DeleteCursorRequest, r.DeleteCursorResponse),
}


class ReplayClient:
    def __init__(self, endpoint: str) -> None:
        # A connection of its own: the process's shared subchannel to a server that was just
        # restarted may still be in reconnect backoff (its last error "Connection refused").
        self.channel = grpc.insecure_channel(
            endpoint, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self._calls = {
            name: self.channel.unary_unary(
                f"/pubsubd.v1.Replay/{name}",
                request_serializer=req.SerializeToString,
                response_deserializer=resp.FromString,
            )
            for name, (req, resp) in _METHODS.items()
        }

    def __getattr__(self, name: str) -> Any:
        if name not in _METHODS:
            raise AttributeError(name)
        req_cls = _METHODS[name][0]
        call = self._calls[name]

        def invoke(**fields: Any) -> Any:
            return call(req_cls(**fields), timeout=30)

        return invoke

    def read_all(self, topic: str, source: int = 0, start: int = 0, **kw: Any) -> list[Any]:
        out: list[Any] = []
        while True:
            resp = self.Read(topic=topic, source=source, start_offset=start, **kw)
            out.extend(resp.messages)
            if not resp.messages:
                return out
            start = resp.next_offset

    def close(self) -> None:
        self.channel.close()
