"""The fuzz targets: every decoder of pubsubd that reads outside input, fed arbitrary bytes.

Each :class:`Target` takes one input (``bytes``) and runs it through a decoder the way the
server does. The contract it checks: the decoder returns a value or raises the decoder's
documented error (``Target.allowed``); anything else (another exception, an assertion of a
property below, a hang, unbounded memory) is a crash. Checksummed formats (storage frames,
the ack journal and snapshot, segment index files) are also fed with the checksum fixed up,
so that the fuzzer reaches the parsing behind the CRC instead of stopping at it.

The targets are run by ``tests/fuzz/run.py`` (atheris, coverage guided, one process per
target) and replayed in-process on the committed corpus (``tests/fuzz/corpus/TARGET/``) by
``tests/fuzz/test_fuzz_decoders.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import google_crc32c
import grpc
from google.protobuf.message import DecodeError

from pubsubd._gen.pubsubd.internal.v1 import routing_pb2, sources_pb2, storage_pb2
from pubsubd.acks import journal
from pubsubd.acks.cursor import Cursor
from pubsubd.api.grpc.status import to_status
from pubsubd.api.grpc.subscriber import _check_modacks
from pubsubd.api.rest import front, routes
from pubsubd.api.rest.transcode import RestError, build_request
from pubsubd.control import routing_store
from pubsubd.core import filters, ids, names, pb, validation
from pubsubd.core.backlog_view import whole_backlogs
from pubsubd.core.errors import InvalidAckId, InvalidArgument, PubsubError
from pubsubd.core.internal_token import InternalIdentity
from pubsubd.core.load import weight
from pubsubd.core.principal import Principal
from pubsubd.core.publish_sources import MAX_SOURCES
from pubsubd.core.records import Entry
from pubsubd.core.tokens import TokenSettings, TokenVerifier, create_token
from pubsubd.data import sources_wire
from pubsubd.observability import http, http_conn
from pubsubd.pulsar import commands, compression, frames, messages
from pubsubd.pulsar import ids as pulsar_ids
from pubsubd.pulsar import names as pulsar_names
from pubsubd.pulsar.api import BaseCommand, CompressionType, MessageMetadata, Type
from pubsubd.storage import framing, segment_index
from pubsubd.storage.errors import CorruptEntry
from pubsubd.storage.node_client import APPEND_PORT_MAGIC, APPEND_PORT_TOKEN_MAGIC, MAX_TOKEN_BYTES
from pubsubd.storagenode import append_port
from pubsubd.storagenode.append_port import AppendPort, BadPreamble, read_preamble
from pubsubd.storagenode.appends import check_version
from pubsubd.storagenode.errors import BadFrames, UnsupportedVersion
from pubsubd.storagenode.ledger_index import parse_frames
from pubsubd.storagenode.ledger_store import decode_fence

__all__ = ["TARGETS", "Target"]

NOW_S = 1_800_000_000.0  # the publish-time clock of the validation targets (fixed: reproducible)


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], None]
    allowed: tuple[type[BaseException], ...]  # the decoder's documented errors
    seeds: Callable[[], list[bytes]]  # well-formed inputs to start from
    max_len: int = 4096  # libFuzzer's -max_len for this target

    def one(self, data: bytes) -> None:
        """Run one input; an allowed error is a correct answer, anything else propagates."""
        with contextlib.suppress(self.allowed):
            self.run(data)


def _crc(data: bytes) -> int:
    return int(google_crc32c.value(data))


def _grpc_refusal(e: PubsubError) -> None:
    """A refusal of outside input must map to a client error, never INTERNAL."""
    code, _ = to_status(e)
    assert code is not grpc.StatusCode.INTERNAL, f"{type(e).__name__} maps to INTERNAL: {e}"


# --- gRPC requests -------------------------------------------------------------------------


def _publish(data: bytes) -> None:
    """Publisher.Publish on the request's wire bytes (api/grpc/publisher.py): parse, check the
    topic name, validate; the flat-view fast path (raw given) must agree with the map-by-map
    path (raw None) on whether the request is valid."""
    try:
        request = pb.PublishRequest.FromString(data)
    except DecodeError:
        return  # the servicer answers INVALID_ARGUMENT
    outcomes = []
    for raw in (data, None):
        try:
            names.topic(request.topic)
            validation.publish_request(request, len(data), raw, now_s=NOW_S)
            outcomes.append(None)
        except PubsubError as e:
            _grpc_refusal(e)
            outcomes.append(type(e).__name__)
    assert outcomes[0] == outcomes[1], f"fast path {outcomes[0]}, map-by-map path {outcomes[1]}"


def _publish_seeds() -> list[bytes]:
    r = pb.PublishRequest(topic="projects/proj-1/topics/topic-1")
    r.messages.add(data=b"hello", attributes={"k": "v", "pubsubd.deliver_after": "10s"})
    r.messages.add(data=b"x", attributes={"a" * 10: "b" * 20})
    s = pb.PublishRequest(topic="projects/proj-1/topics/topic-1")
    s.messages.add(
        data=b"", ordering_key="o", attributes={"pubsubd.deliver_at": "2030-01-01T00:00:00Z"}
    )
    return [r.SerializeToString(), s.SerializeToString()]


def _subscription(data: bytes) -> None:
    """Subscriber.CreateSubscription's checks of a Subscription (names, deadlines, policies,
    the filter, the push endpoint)."""
    s = pb.Subscription.FromString(data)
    try:
        validation.subscription(s)
    except PubsubError as e:
        _grpc_refusal(e)


def _subscription_seeds() -> list[bytes]:
    s = pb.Subscription(
        name="projects/proj-1/subscriptions/sub-1",
        topic="projects/proj-1/topics/topic-1",
        ack_deadline_seconds=30,
        filter='attributes.k = "v" AND NOT hasPrefix(attributes.x, "y")',
        labels={"a": "b"},
    )
    s.push_config.push_endpoint = "https://example.com:8443/push"
    s.dead_letter_policy.dead_letter_topic = "projects/proj-1/topics/dead-letters"
    s.dead_letter_policy.max_delivery_attempts = 7
    s.retry_policy.minimum_backoff.seconds = 5
    s.expiration_policy.ttl.seconds = 90000
    return [s.SerializeToString()]


INCARNATION = "i1"


def _streaming_pull(data: bytes) -> None:
    """A StreamingPullRequest as the subscriber servicer reads it: the modack lists, the stream
    ack deadline and every ack ID (core/ids.py)."""
    request = pb.StreamingPullRequest.FromString(data)
    try:
        _check_modacks(request)
        if request.stream_ack_deadline_seconds:
            validation.ack_deadline(
                "stream_ack_deadline_seconds", request.stream_ack_deadline_seconds
            )
        ack_ids = [*request.ack_ids, *request.modify_deadline_ack_ids]
        _bulk_decoding_agrees(ack_ids)
        for ack_id in ack_ids:
            pos, generation = ids.decode_ack_id(ack_id, INCARNATION)
            assert ids.encode_ack_id(INCARNATION, pos, generation) == ack_id
    except PubsubError as e:
        _grpc_refusal(e)


def _bulk_decoding_agrees(ack_ids: list[str]) -> None:
    """A request's ack IDs decoded together (ids.decode_ack_ids) as one by one: the same
    values, or the same error (the first bad ID's)."""
    try:
        singly = [ids.decode_ack_id(ack_id, INCARNATION) for ack_id in ack_ids]
    except InvalidAckId as e:
        try:
            ids.decode_ack_ids(ack_ids, INCARNATION)
        except InvalidAckId as bulk:
            assert str(bulk) == str(e)
            return
        raise AssertionError("decoded together what one by one refused") from None
    assert ids.decode_ack_ids(ack_ids, INCARNATION) == singly


def _streaming_pull_seeds() -> list[bytes]:
    r = pb.StreamingPullRequest(
        subscription="projects/proj-1/subscriptions/sub-1",
        ack_ids=[ids.encode_ack_id(INCARNATION, ids.position(2, 17), 3)],
        modify_deadline_ack_ids=[ids.encode_ack_id(INCARNATION, 5, 0)],
        modify_deadline_seconds=[30],
        stream_ack_deadline_seconds=60,
    )
    return [r.SerializeToString()]


def _filter(data: bytes) -> None:
    """A subscription filter (core/filters.py) as validation hands it over (at most 256 bytes
    of text): parse, print back, match some attributes."""
    text = data.decode("utf-8", "replace")
    if len(text.encode()) > validation.MAX_FILTER_BYTES:
        return
    f = filters.parse(text)
    again = filters.parse(str(f))
    assert again.expr == f.expr, f"{text!r} prints as {f!s}, which parses differently"
    for attributes in ({}, {"k": "v", "a": ""}, {"x": "yz"}):
        f.matches(attributes)


def _filter_seeds() -> list[bytes]:
    return [
        b'attributes.k = "v"',
        b'NOT attributes:x OR (hasPrefix(attributes.a, "b") AND attributes.c != "d")',
        b"-attributes.\"weird key\" = 'q'",
    ]


# --- REST ----------------------------------------------------------------------------------


def _rest(data: bytes) -> None:
    """A REST call as api/rest/front.py decodes it before calling gRPC: the request line's
    target matched to a rule, the query string and the JSON body bound to the request message,
    the X-Server-Timeout header read. Input: ``METHOD TARGET\\nTIMEOUT\\nBODY``."""
    head, _, body = data.partition(b"\n")
    timeout, _, body = body.partition(b"\n")
    method, _, target = head.decode("latin-1").partition(" ")
    if not target.startswith(http.REST_PREFIX):
        return  # not the REST front's (observability/http.py): the http_connection target's
    parts = urlsplit(target)
    found = routes.match(method, parts.path)
    if found is None:
        routes.verbs_for(parts.path)
        return
    query = parse_qs(parts.query, keep_blank_values=True)
    message = build_request(found, query, body)
    message.SerializeToString()
    t = front._timeout(timeout.decode("latin-1") if timeout else None)
    assert isinstance(t, float | RestError)


def _rest_seeds() -> list[bytes]:
    return [
        b'POST /v1/projects/proj-1/topics/topic-1:publish\n\n{"messages": [{"data": "aGk=", '
        b'"attributes": {"k": "v"}, "orderingKey": "o"}]}',
        b"PUT /v1/projects/proj-1/subscriptions/sub-1?alt=json\n30\n"
        b'{"topic": "projects/proj-1/topics/topic-1", '
        b'"ackDeadlineSeconds": 20, "retryPolicy": {"minimumBackoff": "10s"}, '
        b'"pushConfig": {"pushEndpoint": "https://e.com"}, "labels": {"a": "b"}}',
        b'POST /v1/projects/proj-1/subscriptions/sub-1:acknowledge\n\n{"ackIds": ["a", "b"]}',
        b"GET /v1/projects/proj-1/topics?pageSize=10&pageToken=x\n\n",
        b"PATCH /v1/projects/proj-1/subscriptions/sub-1\n\n"
        b'{"subscription": {"ackDeadlineSeconds": 30},'
        b' "updateMask": "ackDeadlineSeconds"}',
        b'POST /v1/projects/proj-1/subscriptions/sub-1:seek\n\n{"time": "2026-01-01T00:00:00Z"}',
    ]


class _Writer:
    """The half of an asyncio stream ``serve_connection`` writes to, recording the bytes."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    async def drain(self) -> None:
        return None

    def write_eof(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        return None


_loop: asyncio.AbstractEventLoop | None = None
_endpoint: http.HttpEndpoint | None = None


def _http(data: bytes) -> None:
    """One connection of the HTTP port (observability/http_conn.py) served by its real
    dispatch (observability/http.py: health, status, static files, 404s; the REST front is
    the rest_request target): the input is everything the client sends before closing its
    side. The server must answer with whole HTTP/1.1 responses (or nothing), never 500, and
    close the connection."""
    global _loop, _endpoint
    if _loop is None or _endpoint is None:
        _loop = asyncio.new_event_loop()
        _endpoint = http.HttpEndpoint(lambda: {"ok": True})
    endpoint = _endpoint

    async def serve() -> bytes:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        writer = _Writer()
        await asyncio.wait_for(
            http_conn.serve_connection(
                reader,
                writer,  # type: ignore[arg-type]
                endpoint._dispatch,
                lambda target: 64,
                http._error,
            ),
            5,
        )
        assert writer.closed
        return bytes(writer.out)

    out = _loop.run_until_complete(serve())
    assert not out or out.startswith(b"HTTP/1.1 "), out[:80]
    assert b"HTTP/1.1 500 " not in out, out[:200]


def _http_seeds() -> list[bytes]:
    return [
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    ]


# --- Storage formats -----------------------------------------------------------------------


def _frames(data: bytes) -> None:
    """Segment files and storage-node ledgers (storage/framing.py): scan, decode, resynchronise;
    the first input byte picks raw bytes or bodies framed with a correct CRC."""
    if not data:
        return
    mode, data = data[0], data[1:]
    if mode & 1:  # a sequence of bodies, each framed with its length and a correct CRC
        buf = bytearray()
        at = 0
        while at < len(data):
            n = min(data[at], len(data) - at - 1)
            body = data[at + 1 : at + 1 + n]
            buf += struct.pack("<II", len(body), _crc(body)) + body
            at += 1 + n
        data = bytes(buf)
    scan = framing.scan_frames(data)
    decoded, end = framing.decode_frames(data)
    assert end == scan.valid_end and len(decoded) == len(scan.frames)
    for (entry, position, length), info in zip(decoded, scan.frames, strict=True):
        assert (position, length, entry.base_offset, entry.count) == (
            info.position,
            info.length,
            info.base_offset,
            info.count,
        )
        assert framing.encode_entry(entry) == data[position : position + length]
    if end < len(data):
        framing.find_next_frame(data, end, 0)
    with contextlib.suppress(CorruptEntry):
        framing.decode_entry(data)
    framing.decode_frame_at(data, 0)


def _frames_seeds() -> list[bytes]:
    one = framing.encode_entry(Entry(0, 2, 1_700_000_000_000_000, b"payload"))
    two = framing.encode_entry(Entry(2, 1, 1_700_000_000_000_001, b""))
    return [b"\x00" + one + two, b"\x00" + one + b"\xff" * 9 + two]


def _ack_journal(data: bytes) -> None:
    """Recovery of an ack journal (acks/journal.py): header, records replayed onto cursors.
    Mode byte: bit 1, a journal header first; bit 0, each record re-framed with a correct CRC."""
    if not data:
        return
    mode, data = data[0], data[1:]
    if mode & 2 and len(data) >= journal.JOURNAL_HEADER_SIZE:  # a header first
        journal.decode_journal_header(data[: journal.JOURNAL_HEADER_SIZE])
        data = data[journal.JOURNAL_HEADER_SIZE :]
    if mode & 1:
        buf = bytearray()
        at = 0
        while at < len(data):
            n = min(data[at], len(data) - at - 1)
            payload = data[at + 1 : at + 1 + n]
            length = struct.pack("<I", n)
            buf += length + struct.pack("<I", _crc(length + payload)) + payload
            at += 1 + n
        data = bytes(buf)
    cursors: dict[int, Cursor] = {}
    for _, record in journal.iter_records(data, 0):
        journal.apply_record(cursors, record)
    for cursor in cursors.values():
        cursor.acked_ranges()


def _ack_journal_seeds() -> list[bytes]:
    from pubsubd.core.records import CursorState

    body = journal.encode_reset(1, CursorState(5, ((7, 9),))) + journal.encode_ack(1, [(5, 7)])
    return [b"\x02" + journal.encode_journal_header(3) + body, b"\x00" + body]


def _ack_snapshot(data: bytes) -> None:
    """An ack snapshot file (acks/journal.py); mode byte: raw, or with a correct trailing CRC."""
    if not data:
        return
    mode, data = data[0], data[1:]
    if mode & 1:
        data += struct.pack("<I", _crc(data))
    _, states = journal.decode_snapshot(data)
    for state in states.values():
        Cursor.from_state(state)


def _ack_snapshot_seeds() -> list[bytes]:
    from pubsubd.core.records import CursorState

    snap = journal.encode_snapshot(4, {1: CursorState(5, ((7, 9),)), 2: CursorState(0, ())})
    return [b"\x00" + snap, b"\x01" + snap[:-4]]


def _segment_index(data: bytes) -> None:
    """A sealed segment's index file (storage/segment_index.py): a cache, so any damage must
    read as None (scan instead), never raise. Mode byte: raw, or with a correct CRC."""
    if not data:
        return
    mode, data = data[0], data[1:]
    if mode & 1:
        data += struct.pack("<I", _crc(data))
    index = segment_index.decode(data, 7)
    if index is not None:
        assert segment_index.encode(index) == data


def _segment_index_seeds() -> list[bytes]:
    from array import array

    index = segment_index.SegmentIndex(
        7, 10, 300, array("q", [7, 8]), array("q", [0, 50]), array("q", [1, 2])
    )
    encoded = segment_index.encode(index)
    return [b"\x00" + encoded, b"\x01" + encoded[:-4]]


# --- Internal cluster messages --------------------------------------------------------------


def _append_port(data: bytes) -> None:
    """The storage node's append port (storagenode/append_port.py): length-prefixed frames of
    AppendStreamRequest after the preamble; each request's version check and frames parse
    (storagenode/ledger_index.py) before anything touches the store. Also the fence records
    a node keeps beside its ledgers."""
    decode_fence(data[:28])
    at = 0
    while at + 4 <= len(data):
        size = int.from_bytes(data[at : at + 4], "big")
        body = data[at + 4 : at + 4 + size]
        at += 4 + size
        try:
            request = storage_pb2.AppendStreamRequest.FromString(body)
        except DecodeError:
            return  # the port closes the connection
        a = request.append
        try:
            check_version(a.protocol_version)
            if a.frames:
                parsed = parse_frames(a.ledger_id, a.frames)
                assert parsed is not None
        except (UnsupportedVersion, BadFrames) as e:
            _grpc_refusal(e)


def _append_port_seeds() -> list[bytes]:
    frames_ = framing.encode_entry(Entry(0, 1, 1, b"a")) + framing.encode_entry(
        Entry(1, 2, 2, b"bc")
    )
    r = storage_pb2.AppendStreamRequest(request_id=1)
    r.append.protocol_version = 1
    r.append.ledger_id = 3
    r.append.frames = frames_
    body = r.SerializeToString()
    return [len(body).to_bytes(4, "big") + body]


# The append port's authentication as a node with --auth-* runs it: an HS256 secret and one
# static token, and only the internal token's subject let in.
PREAMBLE_SECRET = b"fuzz-preamble-secret-0123456789abcdef"
PREAMBLE_STATIC = "static-internal-token"
PREAMBLE_INTERNAL = Principal.from_subject("writer")
ISSUED_S = 1_700_000_000  # when the seeds' JWTs were issued (PyJWT refuses a future iat)
_preamble_port: AppendPort | None = None
_preamble_loop: asyncio.AbstractEventLoop | None = None  # the readers' (never run: see below)


def _preamble(data: bytes) -> None:
    """The append port's preamble (storagenode/append_port.py): the magic, and with the token
    magic a 4-byte length and the token, which the node's verifier and internal subject check
    (PyJWT on any bytes). A connection is closed (BadPreamble), ends early, or gets a token
    answer: let in only with a valid token of the internal subject, every other append refused
    UNAUTHENTICATED or PERMISSION_DENIED; the frames after the preamble are left unread."""
    global _preamble_port, _preamble_loop
    if _preamble_port is None or _preamble_loop is None:
        _preamble_loop = asyncio.new_event_loop()
        settings = TokenSettings(
            secret=PREAMBLE_SECRET,
            static_tokens={hashlib.sha256(PREAMBLE_STATIC.encode()).digest(): PREAMBLE_INTERNAL},
        )
        verifier = TokenVerifier(settings)
        _preamble_port = AppendPort(
            None,  # type: ignore[arg-type]  # authentication never touches the store
            "127.0.0.1",
            verifier=verifier,
            internal=InternalIdentity.fixed(verifier, frozenset({PREAMBLE_INTERNAL})),
        )
    port = _preamble_port
    reader = asyncio.StreamReader(loop=_preamble_loop)
    reader.feed_data(data)
    reader.feed_eof()
    coroutine = read_preamble(reader)
    try:
        coroutine.send(None)  # fed and ended: it never waits, so it ends on this first step
    except StopIteration as done:
        token = done.value
    else:
        coroutine.close()
        raise AssertionError("read_preamble waited on a reader that has all its input")
    logger = logging.getLogger(append_port.__name__)
    level, logger.level = logger.level, logging.ERROR  # a refusal per input: not logged
    try:
        denied, until, principal = port.authenticate("fuzz", token)
    finally:
        logger.level = level
    magic = len(APPEND_PORT_MAGIC)
    used = magic + (0 if token is None else 4 + int.from_bytes(data[magic : magic + 4], "big"))
    assert len(reader._buffer) == len(data) - used  # type: ignore[attr-defined]
    if denied is None:
        assert token is not None and until > 0 and principal == PREAMBLE_INTERNAL
        return
    answer = denied(7)
    assert answer.request_id == 7 and answer.end_offset == 0
    assert answer.code in (
        grpc.StatusCode.UNAUTHENTICATED.value[0],
        grpc.StatusCode.PERMISSION_DENIED.value[0],
    ), answer


def _preamble_seeds() -> list[bytes]:
    def with_token(token: str) -> bytes:
        body = token.encode()
        return APPEND_PORT_TOKEN_MAGIC + len(body).to_bytes(4, "big") + body

    def jwt(subject: str, **kw: float) -> str:  # issued in 2023: the seeds stay valid
        return create_token(subject, secret=PREAMBLE_SECRET, now=ISSUED_S, **kw)

    return [
        APPEND_PORT_MAGIC + _append_port_seeds()[0],
        with_token(jwt("writer")) + _append_port_seeds()[0],
        with_token(PREAMBLE_STATIC),
        with_token(jwt("admin@pubsubd.local")),  # a client's token: PERMISSION_DENIED
        with_token(jwt("writer", expires_in_s=60)),  # expired in 2023
        with_token(create_token("writer", secret=b"x" * 32, now=ISSUED_S)),  # forged
        APPEND_PORT_TOKEN_MAGIC + (MAX_TOKEN_BYTES + 1).to_bytes(4, "big"),
        APPEND_PORT_TOKEN_MAGIC + b"\x00\x00\x00\x09abc",  # ends inside the token
    ]


def _sources(data: bytes) -> None:
    """The Sources service's ack-state messages (data/sources_wire.py): RecordAcks,
    ResetCursors and the cursors an Attach answers with; malformed ranges are ValueError
    (the servicer answers INVALID_ARGUMENT)."""
    if not data:
        return
    kind, data = data[0] % 3, data[1:]
    if kind == 0:
        acks = sources_wire.acks_from_wire(sources_pb2.RecordAcksRequest.FromString(data).acks)
        assert sources_wire.acks_from_wire(sources_wire.acks_to_wire(acks)) == acks
    else:
        cls = sources_pb2.ResetCursorsRequest if kind == 1 else sources_pb2.AttachResponse
        states = sources_wire.cursors_from_wire(cls.FromString(data).cursors)
        for state in states.values():
            Cursor.from_state(state)


def _sources_seeds() -> list[bytes]:
    acks = sources_pb2.RecordAcksRequest(protocol_version=1, topic_uid="t", subscription_uid="s")
    acks.acks.add(source=1, ranges=[3, 5, 8, 9])
    reset = sources_pb2.ResetCursorsRequest(protocol_version=1, topic_uid="t")
    reset.cursors.add(source=0, mark_delete=4, ranges=[6, 7])
    return [b"\x00" + acks.SerializeToString(), b"\x01" + reset.SerializeToString()]


def _routing(data: bytes) -> None:
    """Routing records in the metadata store (control/routing_store.py): a forwarder's load
    report, its registration, an assignment shard, the routing constraints."""
    if not data:
        return
    kind, data = data[0] % 4, data[1:]
    if kind == 0:
        report = routing_store.decode_forwarder_report(data)
        for load in (*report.topics.values(), *report.subscriptions.values()):
            assert weight(load) >= 1
        shares = [(report.forwarder_id, report.at_unix_s, report.shares)]
        for whole in whole_backlogs(shares).values():
            assert len(whole.missing_sources) <= MAX_SOURCES
    elif kind == 1:
        routing_store.decode_forwarder(data)
    elif kind == 2:
        routing_store.decode_shard(data)
    else:
        routing_store.decode_constraints(data)


def _routing_seeds() -> list[bytes]:
    report = routing_pb2.LoadReport()
    report.topics["t"].messages_per_s = 10.5
    report.topics["t"].outstanding_messages = 4
    report.subscriptions["s"].bytes_per_s = 1e6
    report.backlogs["s"].CopyFrom(
        routing_pb2.BacklogShare(subscription="projects/p/subscriptions/s", sources=[0, 2],
                                 topic_sources=4, messages=9, oldest_unacked_age_s=1.5, spread=True)
    )  # fmt: skip
    shard = routing_pb2.AssignmentShard(protocol_version=1, generation=2, router_id="r")
    shard.routes.add(unit="t", forwarders=["f1", "f2"], moved_at_unix_s=5.0)
    return [b"\x00" + report.SerializeToString(), b"\x02" + shard.SerializeToString()]


# --- Pulsar --------------------------------------------------------------------------------

_SEND = Type.Value("SEND")
_TOPIC_OF = {
    Type.Value("PARTITIONED_METADATA"): "partitionMetadata",
    Type.Value("LOOKUP"): "lookupTopic",
    Type.Value("PRODUCER"): "producer",
    Type.Value("SUBSCRIBE"): "subscribe",
}


def _pulsar(data: bytes) -> None:
    """A Pulsar connection's byte stream (pulsar/connection.py): frames cut into reads of the
    size the first byte says, each command parsed and read as the front reads it (its topic
    name, its request ID, message IDs, a SEND's metadata and payload)."""
    if not data:
        return
    step, data = data[0] % 32 + 1, data[1:]
    decoder = frames.FrameDecoder()
    got: list[frames.Frame] = []
    for at in range(0, len(data), step):
        got += decoder.feed(data[at : at + step])
    for frame in got:
        try:
            cmd = commands.parse_command(frame.command)
        except DecodeError:
            return  # the front answers an ERROR and closes the connection
        commands.request_id_of(cmd)
        field = _TOPIC_OF.get(cmd.type)
        if field is not None:
            request = getattr(cmd, field)
            try:
                topic = pulsar_names.parse_topic(request.topic)
                if cmd.type == Type.Value("SUBSCRIBE"):
                    topic.subscription(request.subscription)
            except pulsar_names.InvalidName:
                pass
        for mid in (*cmd.ack.message_id, *cmd.redeliverUnacknowledgedMessages.message_ids):
            pulsar_ids.key(mid)
            pulsar_ids.position_of(mid)
        if cmd.type == _SEND and frame.metadata is not None:
            with contextlib.suppress(messages.BadPayload):
                _check_sent(messages.unpack_send("p", 1, frame.metadata, frame.payload))


def _check_sent(out: list[messages.OutMessage]) -> None:
    """What a SEND becomes must be a valid Pub/Sub message's text: attributes and ordering key
    are str (protobuf refuses anything else when the publish request is built)."""
    for m in out:
        assert isinstance(m.data, bytes)
        assert isinstance(m.ordering_key, str), repr(m.ordering_key)
        for k, v in m.attributes.items():
            assert isinstance(k, str) and isinstance(v, str), (k, v)


def _pulsar_seeds() -> list[bytes]:
    connect = BaseCommand(type=Type.Value("CONNECT"))
    connect.connect.client_version = "fuzz"
    connect.connect.protocol_version = 20
    lookup = BaseCommand(type=Type.Value("LOOKUP"))
    lookup.lookupTopic.topic = "persistent://public/default/t"
    lookup.lookupTopic.request_id = 3
    send = BaseCommand(type=Type.Value("SEND"))
    send.send.producer_id = 1
    send.send.sequence_id = 0
    meta = MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    meta.properties.add(key="k", value="v")
    stream = (
        commands.frame(connect)
        + commands.frame(lookup)
        + frames.encode_payload_command(send.SerializeToString(), meta.SerializeToString(), b"hi")
    )
    return [b"\x07" + stream]


def _pulsar_send(data: bytes) -> None:
    """A SEND's metadata and (maybe compressed, maybe batched) payload (pulsar/messages.py):
    ``[metadata size:u16][MessageMetadata][payload]``."""
    if len(data) < 2:
        return
    size = int.from_bytes(data[:2], "big")
    _check_sent(messages.unpack_send("p", 1, data[2 : 2 + size], data[2 + size :]))


def _pulsar_send_seeds() -> list[bytes]:
    out = []
    single = messages.SingleMessageMetadata(payload_size=2, partition_key="k")
    single.properties.add(key="a", value="b")
    batch = messages.pack_batch([(single, b"hi"), (single, b"yo")])
    for kind in ("NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"):
        codec = CompressionType.Value(kind)
        meta = MessageMetadata(
            producer_name="p",
            sequence_id=1,
            publish_time=1,
            num_messages_in_batch=2,
            compression=codec,
            uncompressed_size=len(batch),
            deliver_at_time=1_800_000_000_000,
        )
        m = meta.SerializeToString()
        out.append(len(m).to_bytes(2, "big") + m + compression.compress(codec, batch))
    return out


def _compression(data: bytes) -> None:
    """Decompressing a SEND's payload (pulsar/compression.py): ``[kind:u8][declared size:u32]
    [payload]``; the output is bounded by the declared size, whatever the payload holds."""
    if len(data) < 5:
        return
    kind, size = data[0] % 5, int.from_bytes(data[1:5], "big")
    out = compression.decompress(kind, data[5:], size)
    assert kind == compression.NONE or len(out) == size


def _compression_seeds() -> list[bytes]:
    text = b"hello hello hello hello pulsar " * 8
    return [
        bytes([k]) + len(text).to_bytes(4, "big") + compression.compress(k, text) for k in range(5)
    ]


_PROTO_ERRORS = (DecodeError,)

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("grpc_publish", _publish, (), _publish_seeds, 8192),
        Target("grpc_subscription", _subscription, _PROTO_ERRORS, _subscription_seeds),
        Target("grpc_streaming_pull", _streaming_pull, _PROTO_ERRORS, _streaming_pull_seeds),
        Target("subscription_filter", _filter, (InvalidArgument,), _filter_seeds, 300),
        Target("rest_request", _rest, (RestError,), _rest_seeds),
        Target("http_connection", _http, (), _http_seeds),
        Target("storage_frames", _frames, (CorruptEntry,), _frames_seeds),
        Target("ack_journal", _ack_journal, (journal.AckJournalCorruptError,), _ack_journal_seeds),
        Target(
            "ack_snapshot", _ack_snapshot, (journal.AckJournalCorruptError,), _ack_snapshot_seeds
        ),
        Target("segment_index", _segment_index, (), _segment_index_seeds),
        Target("storage_node_append", _append_port, (), _append_port_seeds),
        Target(
            "storage_node_preamble",
            _preamble,
            (BadPreamble, asyncio.IncompleteReadError),
            _preamble_seeds,
            512,
        ),
        Target("sources_wire", _sources, (DecodeError, ValueError), _sources_seeds),
        Target("routing_records", _routing, (DecodeError,), _routing_seeds),
        Target("pulsar_frames", _pulsar, (frames.FrameError,), _pulsar_seeds),
        Target("pulsar_send", _pulsar_send, (messages.BadPayload,), _pulsar_send_seeds),
        Target(
            "pulsar_compression",
            _compression,
            (compression.CompressionError,),
            _compression_seeds,
        ),
    )
}
