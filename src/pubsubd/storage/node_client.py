"""The storage node's internal API as its callers see it: protocol constants, the async client,
typed errors and a channel pool (proto/pubsubd/internal/v1/storage.proto).

A caller (the ledger writer, a recovering owner, the repair auditor) never parses a status
string: the node sends what an error is about in trailing metadata (``pubsubd-reason`` and the
numbers that go with it), and :class:`StorageNodeClient` raises the matching
:class:`StorageNodeError` subclass carrying them (the fence in force, the node's end offset).

Every call (and every append-port connection, ``append_link.py``) carries the process's
internal token (``core/internal_token.py``) when it has one: a node with authentication on
refuses anything else with UNAUTHENTICATED.

This module belongs to the storage layer so the forwarders can import it; the node itself
(``pubsubd.storagenode``) imports the constants from here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from pubsubd._gen.pubsubd.internal.v1 import storage_pb2 as pb
from pubsubd.core.internal_token import INTERNAL_TOKEN
from pubsubd.core.tls import INTERNAL
from pubsubd.storage.errors import StorageError

if TYPE_CHECKING:
    from pubsubd.storage.append_link import AppendLink

__all__ = [
    "APPEND_PORT_MAGIC",
    "CODES",
    "MIN_PROTOCOL_VERSION",
    "PROTOCOL_VERSION",
    "AnswerWaiters",
    "AppendGap",
    "DiskHealth",
    "EncodedAppend",
    "FenceResult",
    "InvalidFrames",
    "LedgerFenced",
    "LedgerNotFound",
    "LedgerSummary",
    "NodeHealth",
    "NodeResourceExhausted",
    "NodeUnavailable",
    "OverlapMismatch",
    "ProtocolMismatch",
    "ReadResult",
    "StorageNodeClient",
    "StorageNodeError",
    "StorageNodePool",
    "encode_append",
    "error_from_status",
    "stream_request",
]

# The newest version this code speaks, and the oldest a node still serves (fields are only
# ever added to the proto; a node refuses a request outside its range with FAILED_PRECONDITION).
PROTOCOL_VERSION = 2  # 2 added AppendStream
MIN_PROTOCOL_VERSION = 1

SERVICE = "pubsubd.internal.v1.StorageNode"
APPEND = f"/{SERVICE}/Append"
APPEND_STREAM = f"/{SERVICE}/AppendStream"
FENCE = f"/{SERVICE}/Fence"
READ = f"/{SERVICE}/Read"
LIST_LEDGERS = f"/{SERVICE}/ListLedgers"
DELETE_LEDGER = f"/{SERVICE}/DeleteLedger"
HEALTH = f"/{SERVICE}/Health"

# Trailing metadata of a refusal: what it is about, and its numbers (decimal strings).
MD_REASON = "pubsubd-reason"
MD_END_OFFSET = "pubsubd-end-offset"
MD_FENCED_EPOCH = "pubsubd-fenced-epoch"
MD_MIN_VERSION = "pubsubd-min-version"
MD_MAX_VERSION = "pubsubd-max-version"
REASON_FENCED = "fenced"
REASON_GAP = "gap"
REASON_MISMATCH = "mismatch"
REASON_PROTOCOL = "protocol"
REASON_DISK_FULL = "disk-full"
REASON_TOO_FEW_DISKS = "too-few-disks"
REASON_STOPPING = "stopping"

# A connection to a node's append port (storagenode/append_port.py) starts with these bytes,
# or, from a writer with a token (core/internal_token.py), with APPEND_PORT_TOKEN_MAGIC, 4 bytes
# of length (big-endian) and the token (UTF-8). Both preambles are the same length.
APPEND_PORT_MAGIC = b"pubsubd-append-port\n"
APPEND_PORT_TOKEN_MAGIC = b"pubsubd-append-auth\n"
MAX_TOKEN_BYTES = 64 << 10

# Frames are up to 64 MiB each (storage/framing.py) and a Read answers at least one whole frame.
MAX_MESSAGE_BYTES = 160 << 20
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Connections of their own: a channel closed while a node restarts on the same address
    # must not hand its dying connection to the next channel made for that address.
    ("grpc.use_local_subchannel_pool", 1),
]
DEFAULT_TIMEOUT_S = 10.0


# --- errors ----------------------------------------------------------------------------------


class StorageNodeError(StorageError):
    """A storage node refused a call or could not be reached. ``retriable``: the same call may
    succeed later on the same node (it was unreachable or stopping)."""

    retriable = False

    def __init__(self, address: str, code: grpc.StatusCode | None, message: str) -> None:
        super().__init__(f"storage node {address}: {message}")
        self.address = address
        self.code = code
        self.message = message


class NodeUnavailable(StorageNodeError):
    """Unreachable (or the connection dropped), past the call's deadline, stopping, or too few
    of its disks are healthy."""

    retriable = True


class NodeResourceExhausted(StorageNodeError):
    """Its disks are full: too few could take the write. The writer moves on to other nodes."""


class InvalidFrames(StorageNodeError):
    """INVALID_ARGUMENT: a frame failed its CRC or framing, or offsets were not consecutive."""


class LedgerNotFound(StorageNodeError):
    """The node holds no such ledger (Read)."""


class LedgerFenced(StorageNodeError):
    """An append from an epoch below the ledger's fence: another owner took over."""

    def __init__(self, address: str, code: grpc.StatusCode | None, message: str, fenced_epoch: int):
        super().__init__(address, code, message)
        self.fenced_epoch = fenced_epoch


class AppendGap(StorageNodeError):
    """The append would leave a gap after what the node holds; resend from ``node_end_offset``."""

    def __init__(
        self, address: str, code: grpc.StatusCode | None, message: str, node_end_offset: int
    ) -> None:
        super().__init__(address, code, message)
        self.node_end_offset = node_end_offset


class OverlapMismatch(StorageNodeError):
    """The append overlaps stored entries with different bytes (or a different first offset)."""

    def __init__(
        self, address: str, code: grpc.StatusCode | None, message: str, node_end_offset: int
    ) -> None:
        super().__init__(address, code, message)
        self.node_end_offset = node_end_offset


class ProtocolMismatch(StorageNodeError):
    """The node does not serve this client's protocol version."""

    def __init__(
        self, address: str, code: grpc.StatusCode | None, message: str, node_min: int, node_max: int
    ) -> None:
        super().__init__(address, code, message)
        self.node_min = node_min
        self.node_max = node_max


_UNREACHABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


def _int(metadata: dict[str, str], key: str, default: int = -1) -> int:
    try:
        return int(metadata[key])
    except (KeyError, ValueError):
        return default


def error_from_rpc(address: str, e: grpc.RpcError) -> StorageNodeError:
    """The typed error for a failed call, from its code and trailing metadata."""
    code = e.code() if hasattr(e, "code") else None
    message = (e.details() if hasattr(e, "details") else None) or str(code)
    raw = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    md = {str(k): v if isinstance(v, str) else v.decode() for k, v in (raw or ())}
    return error_from_status(address, code, message, md)


CODES = {code.value[0]: code for code in grpc.StatusCode}  # google.rpc.Code -> status


def error_from_status(
    address: str, code: grpc.StatusCode | None, message: str, md: dict[str, str]
) -> StorageNodeError:
    """The typed error for a refusal: its code, message and metadata (the trailing metadata of
    a unary call, or the ``metadata`` of an AppendStream answer)."""
    reason = md.get(MD_REASON, "")
    if reason == REASON_FENCED:
        return LedgerFenced(address, code, message, _int(md, MD_FENCED_EPOCH))
    if reason == REASON_GAP:
        return AppendGap(address, code, message, _int(md, MD_END_OFFSET))
    if reason == REASON_MISMATCH:
        return OverlapMismatch(address, code, message, _int(md, MD_END_OFFSET))
    if reason == REASON_PROTOCOL:
        return ProtocolMismatch(
            address, code, message, _int(md, MD_MIN_VERSION), _int(md, MD_MAX_VERSION)
        )
    # CANCELLED reaches us only from the transport (a caller's own cancellation raises
    # asyncio.CancelledError instead): the connection went away.
    if code in _UNREACHABLE:
        return NodeUnavailable(address, code, message)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return NodeResourceExhausted(address, code, message)
    if code == grpc.StatusCode.NOT_FOUND:
        return LedgerNotFound(address, code, message)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidFrames(address, code, message)
    return StorageNodeError(address, code, message)


# --- answers as plain values -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FenceResult:
    exists: bool  # False: the node never received an entry of the ledger (the fence holds)
    first_offset: int
    end_offset: int  # one past the last offset held durable (first_offset if none)
    last_add_confirmed: int  # the highest LAC a writer sent; -1 if none
    fenced_epoch: int  # the fence now in force


@dataclass(frozen=True, slots=True)
class ReadResult:
    frames: bytes  # whole frames from the start offset on
    node_end_offset: int


@dataclass(frozen=True, slots=True)
class LedgerSummary:
    ledger_id: int
    first_offset: int
    end_offset: int
    last_add_confirmed: int
    fenced_epoch: int
    bytes: int
    digest: int  # CRC32C of the frames' CRC fields in order: equal entries, equal digests
    healthy_disks: int


@dataclass(frozen=True, slots=True)
class DiskHealth:
    path: str
    healthy: bool
    free_bytes: int
    error: str


@dataclass(frozen=True, slots=True)
class NodeHealth:
    node_id: str
    zone: str
    protocol_version: int
    min_protocol_version: int
    disks: tuple[DiskHealth, ...]
    free_bytes: int
    ledgers: int
    serving: bool


# --- the client ------------------------------------------------------------------------------


def new_channel(address: str, options: Any = CHANNEL_OPTIONS) -> grpc.aio.Channel:
    """A channel to another process of the cluster: TLS when the process's internal clients
    use it (``core.tls.INTERNAL``), else plaintext. Every internal channel is made here."""
    tls = INTERNAL.tls
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    ca, key, cert = tls.pems()
    credentials = grpc.ssl_channel_credentials(ca, key, cert)
    return grpc.aio.secure_channel(address, credentials, options=options)


_U64 = (1 << 64) - 1


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class EncodedAppend:
    """A serialized AppendRequest in two pieces: ``head``, every field but the frames' bytes
    (frames last, so ``head`` ends with their tag and length), and ``frames`` itself. A writer
    encodes an entry once for all of a ledger's nodes, and the append port sends the frames
    without copying them into a message first."""

    head: bytes
    frames: bytes

    def __len__(self) -> int:
        return len(self.head) + len(self.frames)

    def joined(self) -> bytes:
        return self.head + self.frames


def encode_append(
    ledger_id: int,
    epoch: int,
    first_offset: int,
    frames: bytes,
    last_add_confirmed: int = -1,
    protocol_version: int = PROTOCOL_VERSION,
) -> EncodedAppend:
    """The AppendRequest's wire encoding (protocol buffers' rules; fields in any order parse
    the same): versions, IDs and offsets as varints (an int64 below 0 as its 64-bit two's
    complement), then the frames as a length-delimited field."""
    head = b"".join(
        (
            b"\x08",  # 1: protocol_version
            _varint(protocol_version),
            b"\x10",  # 2: ledger_id
            _varint(ledger_id),
            b"\x18",  # 3: epoch
            _varint(epoch),
            b"\x20",  # 4: first_offset
            _varint(first_offset & _U64),
            b"\x30",  # 6: last_add_confirmed
            _varint(last_add_confirmed & _U64),
            b"\x2a",  # 5: frames
            _varint(len(frames)),
        )
    )
    return EncodedAppend(head, frames)


def stream_request(request_id: int, append: EncodedAppend) -> tuple[bytes, bytes]:
    """AppendStreamRequest{request_id, append} around an encoded AppendRequest, as its head
    and the frames (a message is the concatenation of its fields: the frames are not copied)."""
    prefix = b"\x08" + _varint(request_id) + b"\x12" + _varint(len(append)) + append.head
    return prefix, append.frames


# What an append's answer is handed to: (the node's end offset, None) or (None, the refusal).
AnswerCallback = Callable[[int | None, BaseException | None], None]


class AnswerWaiters:
    """The appends of one stream or connection that wait for their answers, by request ID.
    Each is settled by its answer (:meth:`settle`), its deadline, or the end of the stream
    (:meth:`fail_all`); the AppendStream client and the append port's link share it. A waiter
    is a future (:meth:`add`) or a callback (:meth:`add_callback`), called in the reader's
    own step: no event-loop turn between the answer read and the one waiting for it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._waiting: dict[int, tuple[AnswerCallback, asyncio.TimerHandle]] = {}
        self._next_id = 1

    def add(self, deadline_s: float) -> tuple[int, asyncio.Future[int]]:
        """A new request ID and the future its answer settles; call :meth:`remove` after."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def settled(end_offset: int | None, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(end_offset)  # type: ignore[arg-type]

        return self.add_callback(deadline_s, settled), future

    def add_callback(self, deadline_s: float, callback: AnswerCallback) -> int:
        """A new request ID whose answer (or failure) is handed to ``callback``, once."""
        request_id = self._next_id
        self._next_id += 1
        expiry = asyncio.get_running_loop().call_later(
            deadline_s, self._expire, request_id, deadline_s
        )
        self._waiting[request_id] = (callback, expiry)
        return request_id

    def remove(self, request_id: int) -> None:
        found = self._waiting.pop(request_id, None)
        if found is not None:
            found[1].cancel()

    def settle(self, answer: pb.AppendStreamResponse) -> None:
        """Hand an answer to its append: the end offset, or the refusal as its typed error
        (nobody waits if its caller gave up)."""
        found = self._waiting.pop(answer.request_id, None)
        if found is None:
            return
        callback, expiry = found
        expiry.cancel()
        if answer.code == 0:
            callback(answer.end_offset, None)
        else:
            code = CODES.get(answer.code)
            callback(
                None, error_from_status(self.address, code, answer.message, dict(answer.metadata))
            )

    def fail_all(self, error: StorageNodeError) -> None:
        waiting = list(self._waiting.values())
        self._waiting.clear()
        for callback, expiry in waiting:
            expiry.cancel()
            callback(None, error)

    def _expire(self, request_id: int, deadline_s: float) -> None:
        found = self._waiting.pop(request_id, None)
        if found is not None:
            found[0](
                None,
                NodeUnavailable(
                    self.address,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"append: no answer within {deadline_s:g} s",
                ),
            )


class _StreamEnded(NodeUnavailable):
    """The append's stream ended (the connection dropped, the node stopped) before its answer
    came. Sending it again is safe: a node accepts a retry of what it stores."""


class _AppendStream:
    """One AppendStream call: appends written in call order without waiting for earlier
    answers; answers matched to their callers by request ID. Once the stream ends every
    waiting append fails with the reason (``broken``); the client then opens a new one."""

    def __init__(self, address: str, channel: grpc.aio.Channel) -> None:
        self.address = address
        self._call = channel.stream_stream(
            APPEND_STREAM,
            request_serializer=None,
            response_deserializer=pb.AppendStreamResponse.FromString,
        )(metadata=INTERNAL_TOKEN.metadata())
        self._waiters = AnswerWaiters(address)
        self._write_lock = asyncio.Lock()
        self.broken: StorageNodeError | None = None
        self.unimplemented = False  # the node predates AppendStream: use Append
        self.answered = False  # the node has answered on this stream
        self._reader = asyncio.ensure_future(self._read())

    async def append(self, request: EncodedAppend, deadline_s: float) -> int:
        if self.broken is not None:
            raise self.broken
        request_id, future = self._waiters.add(deadline_s)
        try:
            # Shielded: a caller that gives up must not cut a message in half for the others.
            await asyncio.shield(self._write(request_id, request, future))
            return await future
        finally:
            self._waiters.remove(request_id)

    async def _write(
        self, request_id: int, request: EncodedAppend, future: asyncio.Future[int]
    ) -> None:
        try:
            async with self._write_lock:
                if self.broken is None:
                    await self._call.write(b"".join(stream_request(request_id, request)))
        except (grpc.RpcError, asyncio.InvalidStateError) as e:
            # The stream had ended (the node restarted, the connection dropped) before the
            # reader saw it.
            self.broken = self.broken or _StreamEnded(self.address, None, f"append stream: {e}")
            if not future.done():
                future.set_exception(_StreamEnded(self.address, None, f"append stream: {e}"))
        if self.broken is not None and not future.done():
            future.set_exception(self.broken)

    async def _read(self) -> None:
        broken: StorageNodeError | None = None
        try:
            while True:
                answer = await self._call.read()
                if answer is grpc.aio.EOF:
                    break
                self.answered = True
                self._waiters.settle(answer)
        except grpc.RpcError as e:
            broken = error_from_rpc(self.address, e)
            self.unimplemented = broken.code == grpc.StatusCode.UNIMPLEMENTED
            if isinstance(broken, NodeUnavailable):
                broken = _StreamEnded(self.address, broken.code, broken.message)
        except asyncio.CancelledError:
            broken = _StreamEnded(self.address, None, "append stream closed")
            raise
        finally:
            self.broken = broken or _StreamEnded(self.address, None, "append stream ended")
            self._waiters.fail_all(self.broken)

    async def close(self) -> None:
        self._call.cancel()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class StorageNodeClient:
    """Async stub of one storage node; one method per RPC, answers as plain values, refusals
    as :class:`StorageNodeError` subclasses. Built on a channel it owns, or on one a
    :class:`StorageNodePool` shares (then :meth:`close` leaves the channel open).

    Appends go over the node's append port when ``append_address`` is given (a plain TCP
    connection, ``storage/append_link.py``), else over one AppendStream (opened on first use,
    again after it ends), or over the unary Append when ``append_stream`` is False or the node
    does not serve the stream. An append whose connection or stream ended before its answer is
    sent once more as a unary call (a node accepts a retry of what it stores)."""

    def __init__(
        self,
        address: str,
        *,
        channel: grpc.aio.Channel | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        protocol_version: int = PROTOCOL_VERSION,
        append_stream: bool = True,
        append_address: str = "",
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.protocol_version = protocol_version
        self._owns_channel = channel is None
        self._channel = channel if channel is not None else new_channel(address)
        self._use_stream = append_stream and protocol_version >= 2
        self._stream: _AppendStream | None = None
        self.append_address = append_address
        self._link: AppendLink | None = None
        self._retries: set[asyncio.Future[int]] = set()  # unary retries of submitted appends
        ch = self._channel

        def method(path: str, request: Any, response: Any) -> Any:
            return ch.unary_unary(
                path,
                request_serializer=request.SerializeToString if request is not None else None,
                response_deserializer=response.FromString,
            )

        self._append = method(APPEND, None, pb.AppendResponse)  # serialized requests
        self._fence = method(FENCE, pb.FenceRequest, pb.FenceResponse)
        self._read = method(READ, pb.ReadRequest, pb.ReadResponse)
        self._list = method(LIST_LEDGERS, pb.ListLedgersRequest, pb.ListLedgersResponse)
        self._delete = method(DELETE_LEDGER, pb.DeleteLedgerRequest, pb.DeleteLedgerResponse)
        self._health = method(HEALTH, pb.HealthRequest, pb.HealthResponse)

    @property
    def streaming(self) -> bool:
        """Whether appends go over AppendStream (False once the node turned out not to serve it)."""
        return self._use_stream

    async def _call(self, stub: Any, request: Any, deadline_s: float | None) -> Any:
        try:
            timeout = self.timeout if deadline_s is None else deadline_s
            return await stub(request, timeout=timeout, metadata=INTERNAL_TOKEN.metadata())
        except grpc.RpcError as e:
            raise error_from_rpc(self.address, e) from None

    async def append(
        self,
        ledger_id: int,
        epoch: int,
        first_offset: int,
        frames: bytes,
        last_add_confirmed: int = -1,
        *,
        deadline_s: float | None = None,
    ) -> int:
        """Append frames (consecutive offsets, from the node's end; a retry of stored bytes is
        fine); returns the node's durable end offset."""
        request = encode_append(
            ledger_id, epoch, first_offset, frames, last_add_confirmed, self.protocol_version
        )
        return await self.append_encoded(request, deadline_s=deadline_s)

    async def append_encoded(
        self, request: EncodedAppend, *, deadline_s: float | None = None
    ) -> int:
        """:meth:`append` of a request :func:`encode_append` made."""
        timeout = self.timeout if deadline_s is None else deadline_s
        if self.append_address:
            from pubsubd.storage.append_link import AppendLink, LinkEnded

            link = self._link
            stale = link is not None and link.append_address != self.append_address
            if link is None or link.broken is not None or stale:
                if link is not None:
                    await link.close()
                link = self._link = AppendLink(self.address, self.append_address)
            try:
                return await link.append(request, timeout)
            except LinkEnded:
                pass  # once more as a unary call; the next append connects again
        elif self._use_stream:
            stream = self._stream
            if stream is None or stream.broken is not None:
                stream = self._stream = _AppendStream(self.address, self._channel)
            try:
                return await stream.append(request, timeout)
            except _StreamEnded:
                # Once more as a unary call (a new connection if need be); the next append
                # opens a new stream. A stream that ended before it ever answered may be one
                # the node does not serve: grpc.aio can report a write racing with its
                # UNIMPLEMENTED as INTERNAL, so the node is asked which version it speaks.
                if not stream.answered and not await self._serves_append_stream():
                    self._use_stream = False
            except StorageNodeError:
                if not stream.unimplemented:
                    raise
                self._use_stream = False  # an older node: Append from now on
        response = await self._call(self._append, request.joined(), deadline_s)
        return int(response.end_offset)

    def submit_encoded(self, request: EncodedAppend, answered: AnswerCallback) -> bool:
        """:meth:`append_encoded` without a coroutine, when the node's append port is
        connected: the request is written now and ``answered`` called from the connection's
        reader. False (nothing sent) when it is not: the caller awaits
        :meth:`append_encoded`, which connects. An append whose connection ends before its
        answer is sent once more as a unary call, as there."""
        link = self._link
        if (
            link is None
            or link.broken is not None
            or not self.append_address
            or link.append_address != self.append_address
        ):
            return False
        from pubsubd.storage.append_link import LinkEnded

        def settled(end_offset: int | None, error: BaseException | None) -> None:
            if not isinstance(error, LinkEnded):
                answered(end_offset, error)
                return
            retry = asyncio.ensure_future(self._unary_append(request))
            self._retries.add(retry)
            retry.add_done_callback(self._retries.discard)
            retry.add_done_callback(
                lambda done: answered(
                    None if done.cancelled() or done.exception() else done.result(),
                    (asyncio.CancelledError() if done.cancelled() else done.exception()),
                )
            )

        link.submit(request, self.timeout, settled)
        return True

    async def _unary_append(self, request: EncodedAppend) -> int:
        response = await self._call(self._append, request.joined(), None)
        return int(response.end_offset)

    async def _serves_append_stream(self) -> bool:
        """Whether the node speaks protocol 2 (AppendStream); True when it cannot say now."""
        try:
            health = await self.health(deadline_s=self.timeout)
        except StorageNodeError as e:
            return bool(e.code != grpc.StatusCode.UNIMPLEMENTED)  # no Health: an old node
        return health.protocol_version >= 2

    async def fence(
        self, ledger_id: int, epoch: int, *, deadline_s: float | None = None
    ) -> FenceResult:
        """Raise the ledger's fence to ``epoch`` (durable before it answers)."""
        request = pb.FenceRequest(
            protocol_version=self.protocol_version, ledger_id=ledger_id, epoch=epoch
        )
        r = await self._call(self._fence, request, deadline_s)
        return FenceResult(
            r.exists, r.first_offset, r.end_offset, r.last_add_confirmed, r.fenced_epoch
        )

    async def read(
        self,
        ledger_id: int,
        start_offset: int,
        end_offset: int = 0,
        max_bytes: int = 0,
        *,
        deadline_s: float | None = None,
    ) -> ReadResult:
        """Whole frames from ``start_offset`` (an entry's base offset), below ``end_offset``
        (0: to the node's end), about ``max_bytes`` (0: 4 MiB; at least one frame)."""
        request = pb.ReadRequest(
            protocol_version=self.protocol_version,
            ledger_id=ledger_id,
            start_offset=start_offset,
            end_offset=end_offset,
            max_bytes=max_bytes,
        )
        r = await self._call(self._read, request, deadline_s)
        return ReadResult(r.frames, r.node_end_offset)

    async def list_ledgers(self, *, deadline_s: float | None = None) -> list[LedgerSummary]:
        """The node's copies (ledgers holding entries)."""
        return (await self.list_held(deadline_s=deadline_s))[0]

    async def list_held(
        self, *, deadline_s: float | None = None
    ) -> tuple[list[LedgerSummary], list[int]]:
        """The node's copies, and the ledgers it holds only a fence record of."""
        request = pb.ListLedgersRequest(protocol_version=self.protocol_version)
        r = await self._call(self._list, request, deadline_s)
        return [
            LedgerSummary(
                i.ledger_id,
                i.first_offset,
                i.end_offset,
                i.last_add_confirmed,
                i.fenced_epoch,
                i.bytes,
                i.digest,
                i.healthy_disks,
            )
            for i in r.ledgers
        ], list(r.fenced_only)

    async def delete_ledger(self, ledger_id: int, *, deadline_s: float | None = None) -> bool:
        """Delete the ledger's files; False if the node did not hold it."""
        request = pb.DeleteLedgerRequest(
            protocol_version=self.protocol_version, ledger_id=ledger_id
        )
        r = await self._call(self._delete, request, deadline_s)
        return bool(r.deleted)

    async def health(self, *, deadline_s: float | None = None) -> NodeHealth:
        request = pb.HealthRequest(protocol_version=self.protocol_version)
        r = await self._call(self._health, request, deadline_s)
        disks = tuple(DiskHealth(d.path, d.healthy, d.free_bytes, d.error) for d in r.disks)
        return NodeHealth(
            r.node_id,
            r.zone,
            r.protocol_version,
            r.min_protocol_version,
            disks,
            r.free_bytes,
            r.ledgers,
            r.serving,
        )

    async def close(self) -> None:
        if self._link is not None:
            await self._link.close()
            self._link = None
        if self._stream is not None:
            await self._stream.close()
            self._stream = None
        if self._owns_channel:
            await self._channel.close()


class StorageNodePool:
    """One channel (and client) per node address, made on first use. Call from one event loop;
    :meth:`close` closes every channel."""

    def __init__(self, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout = timeout
        self._clients: dict[str, tuple[grpc.aio.Channel, StorageNodeClient]] = {}

    def client(self, address: str, append_address: str = "") -> StorageNodeClient:
        """The node's client; ``append_address``: its append port, as the node registered it
        (it changes when the node restarts; "" = append over gRPC)."""
        found = self._clients.get(address)
        if found is None:
            channel = new_channel(address)
            found = (channel, StorageNodeClient(address, channel=channel, timeout=self.timeout))
            self._clients[address] = found
        if append_address:
            found[1].append_address = append_address
        return found[1]

    def addresses(self) -> Sequence[str]:
        return list(self._clients)

    async def discard(self, address: str) -> None:
        """Close the channel to a node that left (its address may come back as another node)."""
        found = self._clients.pop(address, None)
        if found is not None:
            await found[1].close()
            await found[0].close()

    async def close(self) -> None:
        found = list(self._clients.values())
        self._clients.clear()
        for channel, client in found:
            await client.close()
            await channel.close()
