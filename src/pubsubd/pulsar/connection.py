"""One Pulsar client connection (asyncio): frames in, commands dispatched, replies out.

A malformed frame gets an ERROR and ends the connection (the byte stream cannot be trusted
after it); a business error answers its request with an ERROR (or the command's own error
field) and the connection stays. Commands that reach the gRPC API run as tasks, so a slow call
never holds up PINGs or acks; the per-producer and per-consumer order is kept by their own
objects (producers.py, consumers.py).

Authentication: with a token verifier (authentication on), CONNECT must carry
``auth_method_name`` "token" and the JWT (or static token) in ``auth_data``, as the
pulsar-client's ``AuthenticationToken`` sends; anything else is answered with an ERROR of
AuthenticationError and the connection ends. The token then goes with every gRPC call the
connection makes (``Gateway.as_caller``). Without a verifier a "token" CONNECT is accepted and
its token passed on all the same (the gRPC port ignores it).

Auth refresh (credentials.py has the rules): a token that expires is challenged ahead of its
expiry (AUTH_CHALLENGE) when the client said ``supports_auth_refresh``; a valid AUTH_RESPONSE
token of the same principal is used for every call that follows, anything else, or no answer by
the expiry, ends the connection with an ERROR of AuthenticationError.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from pubsubd.core import publish_sources, queue_settings
from pubsubd.core.errors import Unauthenticated
from pubsubd.core.failover_rank import FailoverRank
from pubsubd.core.tokens import TokenVerifier
from pubsubd.pulsar import commands, frames, ids, names, schemas
from pubsubd.pulsar.access import AccessMode, Granted, Queued, Refused, TopicAccess
from pubsubd.pulsar.api import CommandSubscribe, ServerError, Type
from pubsubd.pulsar.consumers import Consumer, check_subscription
from pubsubd.pulsar.credentials import NEVER, TOKEN_METHOD, Credentials, check_method
from pubsubd.pulsar.errors import PulsarError
from pubsubd.pulsar.gateway import Gateway
from pubsubd.pulsar.producers import Producer
from pubsubd.pulsar.streams import OpenInProcess

log = logging.getLogger(__name__)

_ids = itertools.count(1)

SUBSCRIPTION_TYPES = {
    CommandSubscribe.Exclusive: queue_settings.SubscriptionType.EXCLUSIVE.value,
    CommandSubscribe.Shared: queue_settings.SubscriptionType.SHARED.value,
    CommandSubscribe.Failover: queue_settings.SubscriptionType.FAILOVER.value,
    CommandSubscribe.Key_Shared: queue_settings.SubscriptionType.KEY_SHARED.value,
}


class ServerState:
    """What the connections of one server share."""

    def __init__(
        self,
        gateway: Gateway,
        incarnation: str,
        server_version: str,
        verifier: TokenVerifier | None = None,
        tls: bool = False,
        open_in_process: OpenInProcess | None = None,
    ) -> None:
        self.gateway = gateway
        # Consumers' streams opened in this process (streams.py), None: through the gateway.
        self.open_in_process = open_in_process
        self.verifier = verifier  # None: authentication off
        self.tls = tls  # the port speaks TLS: lookups answer pulsar+ssl:// URLs
        self.incarnation = incarnation  # part of every dedup ID (see producers.py)
        self.server_version = server_version
        # (topic, producer name) -> highest sequence ID stored by this process, for
        # PRODUCER_SUCCESS.last_sequence_id when a named producer comes back.
        self.last_sequence: dict[tuple[str, str], int] = {}
        # Full Pulsar topic name (a partition's own) -> its producers' access modes (access.py).
        self.access: dict[str, TopicAccess[ProducerSlot]] = {}
        # Google topic -> the first Avro or Json schema (type, definition) a producer or consumer
        # declared on it while it has no Google schema: what GET_SCHEMA answers then (kept in
        # memory only; the schema is not checked nor stored).
        self.declared_schemas: dict[str, tuple[int, bytes]] = {}


@dataclass(eq=False)
class ProducerSlot:
    """One PRODUCER in a topic's access state: its connection, and how to start it once it
    holds the topic (a queued WaitForExclusive producer is started later)."""

    connection: Connection
    producer_id: int
    request_id: int
    topic: str  # the full Pulsar name: the key of ServerState.access
    start: Callable[[int | None], None]


class Connection:
    def __init__(
        self, state: ServerState, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.state = state
        self.gateway = state.gateway
        self.reader = reader
        self.writer = writer
        self.id = next(_ids)
        self.decoder = frames.FrameDecoder()
        self.connected = False
        self.producers: dict[int, Producer] = {}
        # Each producer's place in its topic's access state; ``waiting``: the queued ones.
        self.slots: dict[int, ProducerSlot] = {}
        self.waiting: dict[int, ProducerSlot] = {}
        self._fenced: set[int] = set()  # producers the server closed: their SENDs are dropped
        self.closed = False  # the connection is ending
        self.consumers: dict[int, Consumer] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # With authentication on, once connected: the token in use and until when.
        self.credentials: Credentials | None = None
        self._refreshable = False  # the client answers AUTH_CHALLENGE (CONNECT's feature flag)
        self._client_protocol = 0
        self._auth_timer: asyncio.TimerHandle | None = None  # the next challenge or the cut-off
        host, port = writer.get_extra_info("sockname")[:2]
        self.url = f"pulsar+ssl://{host}:{port}" if state.tls else f"pulsar://{host}:{port}"
        self._handlers: dict[int, Callable[[Any, frames.Frame], None]] = {
            Type.Value("CONNECT"): self._connect,
            Type.Value("AUTH_RESPONSE"): self._auth_response,
            Type.Value("PING"): lambda c, f: self.write(commands.pong()),
            Type.Value("PONG"): lambda c, f: None,
            Type.Value("PARTITIONED_METADATA"): self._partitioned_metadata,
            Type.Value("LOOKUP"): self._lookup,
            Type.Value("GET_TOPICS_OF_NAMESPACE"): self._topics_of_namespace,
            Type.Value("PRODUCER"): self._producer,
            Type.Value("SEND"): self._send,
            Type.Value("CLOSE_PRODUCER"): self._close_producer,
            Type.Value("SUBSCRIBE"): self._subscribe,
            Type.Value("FLOW"): self._flow,
            Type.Value("ACK"): self._ack,
            Type.Value("REDELIVER_UNACKNOWLEDGED_MESSAGES"): self._redeliver,
            Type.Value("CLOSE_CONSUMER"): self._close_consumer,
            Type.Value("UNSUBSCRIBE"): self._unsubscribe,
            Type.Value("SEEK"): self._seek,
            Type.Value("GET_LAST_MESSAGE_ID"): self._last_message_id,
            Type.Value("GET_SCHEMA"): self._get_schema,
        }

    # --- I/O -------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(data)

    async def serve(self) -> None:
        try:
            while True:
                data = await self.reader.read(256 * 1024)
                if not data:
                    return
                try:
                    received = self.decoder.feed(data)
                except frames.FrameError as e:
                    self._fatal(f"malformed frame: {e}")
                    return
                for frame in received:
                    if not self._handle(frame):
                        return
                if self.writer.transport.get_write_buffer_size() > 8 * 1024 * 1024:
                    await self.writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            await self._close()

    def _fatal(self, message: str) -> None:
        log.info("pulsar connection %d: %s; closing it", self.id, message)
        self.write(commands.error(0, ServerError.Value("UnknownError"), message))

    def _handle(self, frame: frames.Frame) -> bool:
        try:
            cmd = commands.parse_command(frame.command)
        except DecodeError as e:
            self._fatal(f"malformed command: {e}")
            return False
        if not self.connected and cmd.type != Type.Value("CONNECT"):
            self._fatal(f"expected CONNECT first, got command type {cmd.type}")
            return False
        handler = self._handlers.get(cmd.type)
        if handler is None:
            self._unsupported(cmd)
            return True
        try:
            handler(cmd, frame)
        except PulsarError as e:
            self._answer_error(cmd, e)
        return not self.writer.is_closing()  # closed by the handler: read no further

    def _spawn(self, cmd: Any, work: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await work
            except PulsarError as e:
                self._answer_error(cmd, e)
            except Exception as e:  # an unexpected failure answers the request, never the loop
                log.exception("pulsar command %s failed", Type.Name(cmd.type))
                self._answer_error(cmd, PulsarError("UnknownError", f"internal error: {e}"))

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _answer_error(self, cmd: Any, e: PulsarError) -> None:
        request_id = commands.request_id_of(cmd)
        if cmd.type == Type.Value("PARTITIONED_METADATA"):
            self.write(commands.partitioned_metadata_error(request_id or 0, e.code, e.message))
        elif cmd.type == Type.Value("LOOKUP"):
            self.write(commands.lookup_error(request_id or 0, e.code, e.message))
        elif cmd.type == Type.Value("GET_SCHEMA"):
            self.write(commands.schema_error(request_id or 0, e.code, e.message))
        elif request_id is not None:
            self.write(commands.error(request_id, e.code, e.message))
        else:
            log.info("pulsar connection %d: %s: %s", self.id, Type.Name(cmd.type), e.message)

    def _unsupported(self, cmd: Any) -> None:
        name = Type.Name(cmd.type) if cmd.type in Type.values() else str(cmd.type)
        what = f"{name} is not supported by pubsubd"
        if cmd.type in _TRANSACTION_COMMANDS:
            what = f"transactions are not supported by pubsubd ({name})"
        self._answer_error(cmd, PulsarError("NotAllowedError", what))

    async def _close(self) -> None:
        self._disarm()
        self.closed = True
        for producer in self.producers.values():
            producer.abort()
        # The queued producers leave their queues first, so releasing a held topic never
        # promotes a producer of this connection; a topic passes on before the consumers end.
        slots = [*self.waiting.values(), *self.slots.values()]
        self.waiting.clear()
        self.slots.clear()
        for slot in slots:
            self._release(slot)
        for consumer in list(self.consumers.values()):
            await self._end_consumer(consumer)
        for task in list(self._tasks):
            task.cancel()
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()

    # --- connection and discovery ----------------------------------------------------------

    def _connect(self, cmd: Any, frame: frames.Frame) -> None:
        if self.connected:
            raise PulsarError("NotAllowedError", "already connected")
        method = cmd.connect.auth_method_name
        token = cmd.connect.auth_data.decode(errors="replace") if method == "token" else ""
        credentials = None
        try:
            if method not in ("", "none", "token"):
                raise Unauthenticated(f"authentication {method!r} is not supported; use token")
            if self.state.verifier is not None:
                if not token:
                    raise Unauthenticated("this server needs a token (AuthenticationToken)")
                credentials = self._verified(token)
        except Unauthenticated as e:
            log.info("pulsar connection %d refused: %s", self.id, e)
            self._end_unauthenticated(str(e))
            return
        if token:
            self.gateway = self.state.gateway.as_caller(token)
        self.connected = True
        self._client_protocol = cmd.connect.protocol_version
        self._refreshable = cmd.connect.feature_flags.supports_auth_refresh
        self.write(commands.connected(cmd.connect.protocol_version, self.state.server_version))
        if credentials is not None:
            self.credentials = credentials
            self._plan_refresh()

    # --- auth refresh (credentials.py) -----------------------------------------------------

    def _verified(self, token: str) -> Credentials:
        assert self.state.verifier is not None
        principal, until = self.state.verifier.verify_until(token)
        return Credentials(principal, token, until, time.time())

    def _end_unauthenticated(self, reason: str) -> None:
        """ERROR AuthenticationError, then the connection ends (the read loop with it)."""
        self._disarm()
        self.write(commands.error(0, ServerError.Value("AuthenticationError"), reason))
        self.writer.close()

    def _plan_refresh(self) -> None:
        """Arm the next challenge, or the cut-off for a client that cannot refresh."""
        self._disarm()
        credentials = self.credentials
        if credentials is None or credentials.until == NEVER:
            return
        at = credentials.challenge_at(self._refreshable)
        if at == NEVER:
            self._arm(credentials.until, self._expire)
        else:
            self._arm(at, self._challenge)

    def _arm(self, at: float, action: Callable[[], None]) -> None:
        delay = max(0.0, at - time.time())
        self._auth_timer = asyncio.get_running_loop().call_later(delay, action)

    def _disarm(self) -> None:
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None

    def _challenge(self) -> None:
        assert self.credentials is not None
        log.debug("pulsar connection %d: AUTH_CHALLENGE", self.id)
        self.write(
            commands.auth_challenge(self._client_protocol, self.state.server_version, TOKEN_METHOD)
        )
        self._arm(self.credentials.until, self._expire)

    def _expire(self) -> None:
        self._auth_timer = None
        if self.credentials is None:
            return
        if not self.credentials.expired(time.time()):
            # Early (the loop's timers run on another clock, and may fire a little ahead; or
            # the wall clock went back): wait for the expiry again, without a second challenge.
            self._arm(self.credentials.until, self._expire)
            return
        reason = "the token has expired" + (
            " and was not refreshed" if self._refreshable else " (the client cannot refresh it)"
        )
        log.info("pulsar connection %d: %s; closing it", self.id, reason)
        self._end_unauthenticated(reason)

    def _auth_response(self, cmd: Any, frame: frames.Frame) -> None:
        """Fresh credentials (after a challenge, or unasked): the same principal's valid token
        replaces the connection's; anything else ends the connection."""
        if self.credentials is None:  # authentication off: nothing to refresh
            return
        response = cmd.authResponse.response
        token = response.auth_data.decode(errors="replace")
        try:
            check_method(response.auth_method_name)
            refreshed = self.credentials.refreshed(self._verified(token))
        except Unauthenticated as e:
            log.info("pulsar connection %d: auth refresh refused: %s; closing it", self.id, e)
            self._end_unauthenticated(f"auth refresh refused: {e}")
            return
        self.credentials = refreshed
        self.gateway.use_token(token)
        log.info(
            "pulsar connection %d: credentials of %s refreshed",
            self.id,
            refreshed.principal.member,
        )
        self._plan_refresh()

    def _partitioned_metadata(self, cmd: Any, frame: frames.Frame) -> None:
        """A topic of K > 1 publish message sources has K partitions; one source (or a topic
        not created yet, or a partition's own name) is a non-partitioned topic (0)."""
        request = cmd.partitionMetadata
        topic = _topic(request.topic)
        if topic.partition is not None:
            self.write(commands.partitioned_metadata(request.request_id, 0))
            return

        async def answer() -> None:
            found = await self.gateway.get_topic(topic.google)
            count = _source_count(found) if found is not None else 1
            self.write(commands.partitioned_metadata(request.request_id, count if count > 1 else 0))

        self._spawn(cmd, answer())

    def _lookup(self, cmd: Any, frame: frames.Frame) -> None:
        request = cmd.lookupTopic
        try:
            names.parse_topic(request.topic)
        except names.InvalidName as e:
            raise _invalid_name(e) from e
        self.write(commands.lookup_connect(request.request_id, self.url))

    def _topics_of_namespace(self, cmd: Any, frame: frames.Frame) -> None:
        """The namespace's topics (names.namespace_topics), for pattern consumers: ListTopics
        of its tenant's project. Non-persistent topics: none."""
        request = cmd.getTopicsOfNamespace
        try:
            tenant, _ = names.parse_namespace(request.namespace)
        except names.InvalidName as e:
            raise _invalid_name(e) from e

        async def answer() -> None:
            found: list[str] = []
            if request.mode != request.NON_PERSISTENT:
                topics = await self.gateway.list_topics(f"projects/{tenant}")
                found = names.namespace_topics(request.namespace, topics)
            self.write(commands.topics_of_namespace(request.request_id, found))

        self._spawn(cmd, answer())

    # --- producers -------------------------------------------------------------------------

    def _producer(self, cmd: Any, frame: frames.Frame) -> None:
        request = cmd.producer
        topic = _topic(request.topic)
        if request.producer_access_mode not in AccessMode._value2member_map_:
            raise PulsarError(
                "NotAllowedError", f"unknown producer access mode {request.producer_access_mode}"
            )
        mode = AccessMode(request.producer_access_mode)
        if request.txn_enabled:
            raise PulsarError("NotAllowedError", "transactions are not supported")
        self._fenced.discard(request.producer_id)
        name = (
            request.producer_name
            or f"pubsubd-{self.state.incarnation}-{self.id}-{request.producer_id}"
        )
        if self._repeated_producer(request, name):
            return
        topic_epoch = request.topic_epoch if request.HasField("topic_epoch") else None

        async def create() -> None:
            found = await self.gateway.ensure_topic(topic.google)
            source = _partition_source(topic, found)
            version = await self._checked_schema(found, request)
            if self._repeated_producer(request, name):
                return
            key = (topic.pulsar, name)
            last = self.state.last_sequence

            def stored(seq: int) -> None:
                last[key] = max(last.get(key, -1), seq)

            def start(epoch: int | None) -> None:
                """The producer holds (or shares) the topic: it may send."""
                self.waiting.pop(request.producer_id, None)
                if self.closed:  # promoted as its connection ends: passes the topic on
                    self._release(slot)
                    return
                self.slots[request.producer_id] = slot
                self.producers[request.producer_id] = Producer(
                    self.gateway,
                    self.write,
                    request.producer_id,
                    topic.google,
                    name,
                    f"pulsar/{self.state.incarnation}/"
                    + ("" if source is None else f"partition-{source}/"),
                    stored,
                    source,
                )
                self.write(
                    commands.producer_success(
                        request.request_id,
                        name,
                        last.get(key, -1),
                        topic_epoch=epoch,
                        schema_version=version,
                    )
                )

            slot = ProducerSlot(self, request.producer_id, request.request_id, topic.pulsar, start)
            access = self.state.access.setdefault(topic.pulsar, TopicAccess())
            decision = access.request(slot, name, mode, topic_epoch)
            if isinstance(decision, Refused):
                raise PulsarError(decision.error, decision.message)
            if isinstance(decision, Queued):
                self.waiting[request.producer_id] = slot
                self.write(commands.producer_success(request.request_id, name, -1, ready=False))
                return
            assert isinstance(decision, Granted)
            # Held from now on: a CLOSE_PRODUCER or the connection's end releases it.
            self.slots[request.producer_id] = slot
            for fenced in decision.refused:  # queued producers an ExclusiveWithFencing passed
                fenced.connection.refuse_waiting(fenced, "Fenced out by an exclusive producer")
            # Fenced producers finish their publish in flight before this one may send.
            await asyncio.gather(*(f.connection.fence(f) for f in decision.fenced))
            if self.slots.get(request.producer_id) is slot and not self.writer.is_closing():
                start(decision.epoch)

        self._spawn(cmd, create())

    async def _topic_schema(self, topic: Any, version: bytes = b"") -> schemas.TopicSchema | None:
        """The topic's schema (at its newest revision in range, or the revision ``version``
        names), None when it has none."""
        settings = topic.schema_settings
        if not topic.HasField("schema_settings") or not settings.schema:
            return None
        revision = version.decode(errors="replace") or settings.last_revision_id
        found = await self.gateway.get_schema(
            f"{settings.schema}@{revision}" if revision else settings.schema
        )
        name = f"{settings.schema}@{found.revision_id}"
        return schemas.TopicSchema(name, found.type_, found.definition, settings.encoding)

    async def _checked_schema(self, topic: Any, request: Any) -> bytes:
        """A PRODUCER's or SUBSCRIBE's schema against the topic's (pulsar/schemas.py): the
        schema version to answer (the topic schema's revision ID), or IncompatibleSchema."""
        if not request.HasField("schema"):
            return b""
        found = await self._topic_schema(topic)
        if found is None:  # no schema on the topic: taken unchecked, and GET_SCHEMA answers it
            kind = request.schema.type
            if kind in (schemas.PULSAR_AVRO, schemas.PULSAR_JSON):
                declared = self.state.declared_schemas
                declared.setdefault(topic.name, (kind, request.schema.schema_data))
            return b""
        try:
            schemas.check(found, request.schema.type, request.schema.schema_data)
        except schemas.SchemaMismatch as e:
            raise PulsarError("IncompatibleSchema", str(e)) from e
        return found.name.rsplit("@", 1)[1].encode()

    def _get_schema(self, cmd: Any, frame: frames.Frame) -> None:
        """GET_SCHEMA: the topic's schema as a Pulsar Avro (BINARY encoding) or Json (JSON)
        schema; TopicNotFound when it has none, as Pulsar answers."""
        request = cmd.getSchema
        topic = _topic(request.topic)

        async def answer() -> None:
            found = await self.gateway.get_topic(topic.google)
            schema = (
                None if found is None else await self._topic_schema(found, request.schema_version)
            )
            if schema is None:
                declared = self.state.declared_schemas.get(topic.google)
                if declared is None:
                    raise PulsarError(
                        "TopicNotFound", f"{topic.pulsar}: topic not found or no schema"
                    )
                self.write(
                    commands.schema_response(
                        request.request_id, topic.local, declared[0], declared[1], b""
                    )
                )
                return
            kind = schema.pulsar_type
            if kind is None:
                raise PulsarError(
                    "NotAllowedError",
                    f"{topic.pulsar}: its schema {schema.name} is a Protocol Buffer schema, "
                    "which no Pulsar schema maps to",
                )
            self.write(
                commands.schema_response(
                    request.request_id,
                    topic.local,
                    kind,
                    schema.definition.encode(),
                    schema.name.rsplit("@", 1)[1].encode(),
                )
            )

        self._spawn(cmd, answer())

    def _repeated_producer(self, request: Any, name: str) -> bool:
        """The client repeats a PRODUCER it had no answer to (after a timeout): answered
        again, nothing new made."""
        existing = self.producers.get(request.producer_id)
        if existing is not None:
            self.write(commands.producer_success(request.request_id, existing.name, -1))
            return True
        if request.producer_id in self.waiting:
            self.write(commands.producer_success(request.request_id, name, -1, ready=False))
            return True
        return False

    async def fence(self, slot: ProducerSlot) -> None:
        """Close a producer another one fenced out (ExclusiveWithFencing): its publish in
        flight is answered, then CLOSE_PRODUCER; the client reconnects it with its topic
        epoch, which access.py refuses (ProducerFenced)."""
        if self.slots.get(slot.producer_id) is not slot:
            return
        del self.slots[slot.producer_id]
        self._fenced.add(slot.producer_id)
        producer = self.producers.pop(slot.producer_id, None)
        if producer is None:  # granted, not answered yet (itself waiting for a fencing)
            self.write(
                commands.error(
                    slot.request_id,
                    ServerError.Value("ProducerFenced"),
                    "Fenced out by an exclusive producer",
                )
            )
            return
        await producer.fence()
        self.write(commands.close_producer(slot.producer_id))

    def refuse_waiting(self, slot: ProducerSlot, message: str) -> None:
        """A queued WaitForExclusive producer will never hold the topic: its PRODUCER fails
        with ProducerFenced."""
        if self.waiting.get(slot.producer_id) is slot:
            del self.waiting[slot.producer_id]
            self.write(
                commands.error(slot.request_id, ServerError.Value("ProducerFenced"), message)
            )

    def _release(self, slot: ProducerSlot) -> None:
        """The producer closed or its connection ended: the topic may pass to a queued one."""
        access = self.state.access.get(slot.topic)
        if access is None:
            return
        released = access.release(slot)
        for refused in released.refused:
            refused.connection.refuse_waiting(refused, "Topic epoch has already moved")
        if released.promoted is not None:
            released.promoted.key.start(released.promoted.epoch)
        if access.idle and access.epoch is None:
            del self.state.access[slot.topic]

    def _send(self, cmd: Any, frame: frames.Frame) -> None:
        producer = self.producers.get(cmd.send.producer_id)
        if producer is None:
            if cmd.send.producer_id in self._fenced:
                return  # sent before the client saw CLOSE_PRODUCER: it sends it again
            self.write(
                commands.send_error(
                    cmd.send.producer_id,
                    cmd.send.sequence_id,
                    ServerError.Value("NotAllowedError"),
                    f"no producer {cmd.send.producer_id} on this connection",
                )
            )
            return
        producer.send(cmd.send, frame)

    def _close_producer(self, cmd: Any, frame: frames.Frame) -> None:
        request = cmd.close_producer
        producer = self.producers.pop(request.producer_id, None)
        slot = self.slots.pop(request.producer_id, None) or self.waiting.pop(
            request.producer_id, None
        )

        async def close() -> None:
            if producer is not None:
                await producer.close()
            if slot is not None:  # after its last SENDs: the next holder comes after them
                self._release(slot)
            self.write(commands.success(request.request_id))

        self._spawn(cmd, close())

    # --- consumers -------------------------------------------------------------------------

    def _subscribe(self, cmd: Any, frame: frames.Frame) -> None:
        request = cmd.subscribe
        topic = _topic(request.topic)
        try:
            name = request.subscription
            if not request.durable and topic.partition is not None and "/" not in name:
                # A reader (or non-durable consumer) of a partitioned topic is one per partition,
                # all with one subscription name: each gets a temporary subscription of its
                # own, so one partition's positioning (a SeekOffsets, which redelivers what the
                # subscription has outstanding) never replays another's messages.
                name = f"{name}-partition-{topic.partition}"
            subscription = topic.subscription(name)
        except names.InvalidName as e:
            raise _invalid_name(e) from e
        if request.consumer_id in self.consumers:
            self.write(commands.success(request.request_id))
            return
        kind = SUBSCRIPTION_TYPES.get(request.subType, "shared")
        temporary = not request.durable  # a reader, or a non-durable subscription
        # One Pulsar consumer of a partitioned topic is a consumer per partition, all with its
        # name (a reader's have none, but their own subscription): one client_id makes them
        # one client (failover, exclusive and key_shared rules). A failover consumer ranks by
        # its priority level and name (core/failover_rank.py); a non-partitioned topic's
        # consumers are placed on a hash ring its name picks from, as Pulsar does.
        rank = None
        if kind == "failover":
            rank = FailoverRank(
                request.priority_level,
                request.consumer_name,
                topic.pulsar if topic.partition is None else "",
            )
        if topic.partition is not None:
            name = request.consumer_name or request.subscription
            client_id = f"pulsar-name-{name}-{self.state.incarnation}-{self.id}"
        else:
            client_id = f"pulsar-{self.state.incarnation}-{self.id}-{request.consumer_id}"

        async def subscribe() -> None:
            found = await self.gateway.ensure_topic(topic.google)
            source = _partition_source(topic, found)
            await self._checked_schema(found, request)
            sources = None if source is None else frozenset({source})
            labels = {
                queue_settings.TYPE_LABEL: kind,
                queue_settings.DELIVERY_ATTEMPTS_LABEL: "always",
            }
            if temporary:
                labels[READER_LABEL] = "true"
            existing, created = await self.gateway.get_or_create_subscription(
                subscription, topic.google, labels
            )
            if not created:
                check_subscription(existing, topic.google, kind, queue_settings.TYPE_LABEL)
                if temporary and existing.labels.get(READER_LABEL) != "true":
                    # A reader acks what it reads and deletes its subscription: never a
                    # durable one's.
                    raise PulsarError(
                        "NotAllowedError",
                        f"subscription {subscription} is durable; a reader needs a name of its own",
                    )
            if temporary and request.HasField("start_message_id"):
                await self._seek_to(subscription, topic.google, sources, request.start_message_id)
            elif created and request.initialPosition == CommandSubscribe.Earliest:
                if temporary:
                    earliest = ids.message_id_data(ids.EARLIEST, ids.EARLIEST)
                    await self._seek_to(subscription, topic.google, sources, earliest)
                else:
                    await self.gateway.seek_time(subscription, 0)
            consumer = Consumer(
                self.gateway,
                self.write,
                request.consumer_id,
                subscription,
                client_id,
                cumulative_ok=kind in ("exclusive", "failover"),
                topic=topic.google,
                sources=sources,
                auto_ack=temporary,
                failover=rank,
                open_in_process=self.state.open_in_process,
            )
            await consumer.open()
            consumer.on_lost = self._consumer_lost
            self.consumers[request.consumer_id] = consumer
            self.write(commands.success(request.request_id))

        self._spawn(cmd, subscribe())

    def _consumer_lost(self, consumer: Consumer) -> None:
        """The server ended the consumer's stream: give back what it held and tell the client,
        which subscribes again."""
        if self.consumers.get(consumer.consumer_id) is consumer:
            del self.consumers[consumer.consumer_id]
            self.write(commands.close_consumer(consumer.consumer_id))
            task = asyncio.create_task(consumer.close())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _consumer(self, consumer_id: int) -> Consumer:
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            raise PulsarError("ConsumerNotFound", f"no consumer {consumer_id} on this connection")
        return consumer

    def _flow(self, cmd: Any, frame: frames.Frame) -> None:
        consumer = self.consumers.get(cmd.flow.consumer_id)
        if consumer is not None:
            consumer.flow(cmd.flow.messagePermits)

    def _ack(self, cmd: Any, frame: frames.Frame) -> None:
        self._consumer(cmd.ack.consumer_id).ack(cmd.ack)

    def _redeliver(self, cmd: Any, frame: frames.Frame) -> None:
        consumer = self.consumers.get(cmd.redeliverUnacknowledgedMessages.consumer_id)
        if consumer is not None:
            consumer.redeliver(cmd.redeliverUnacknowledgedMessages)

    def _close_consumer(self, cmd: Any, frame: frames.Frame) -> None:
        request = cmd.close_consumer
        consumer = self.consumers.pop(request.consumer_id, None)

        async def close() -> None:
            if consumer is not None:
                await self._end_consumer(consumer)
            self.write(commands.success(request.request_id))

        self._spawn(cmd, close())

    async def _end_consumer(self, consumer: Consumer) -> None:
        """The client closed the consumer (or its connection): a reader's temporary
        subscription goes with it."""
        await consumer.close()
        if consumer.auto_ack:
            try:
                await self.gateway.delete_subscription(consumer.subscription)
            except Exception as e:  # the server may be stopping: the subscription stays
                log.info("reader subscription %s not deleted: %s", consumer.subscription, e)

    async def _seek_to(
        self,
        subscription: str,
        topic: str,
        sources: frozenset[int] | None,
        mid: Any,
        after: bool = False,
    ) -> None:
        """Deliver again from the message ``mid`` names (``after``: from the one after it;
        earliest/latest: of every source the consumer reads): its source's ack state moves
        there, exactly (SeekOffsets)."""
        ranges = (await self.gateway.topic_ranges(topic)).sources
        wanted = [r for r in ranges if sources is None or r.source in sources]
        if ids.EARLIEST in (mid.ledgerId, mid.entryId):
            offsets = {r.source: r.earliest_offset for r in wanted}
        elif ids.LATEST in (mid.ledgerId, mid.entryId):
            offsets = {r.source: r.latest_offset for r in wanted}
        else:
            source, offset = ids.key(mid)
            if not any(r.source == source for r in wanted):
                raise PulsarError(
                    "NotAllowedError",
                    f"message ID ({mid.ledgerId}, {mid.entryId}) is not of a partition (publish "
                    f"message source) this consumer reads",
                )
            offsets = {source: offset + 1 if after else offset}
        await self.gateway.seek_offsets(subscription, offsets)

    def _last_message_id(self, cmd: Any, frame: frames.Frame) -> None:
        """The ID of the last message the consumer's partition (source) holds; with no
        message retained, the entry is -1."""
        request = cmd.getLastMessageId
        consumer = self._consumer(request.consumer_id)

        async def answer() -> None:
            ranges = (await self.gateway.topic_ranges(consumer.topic)).sources
            mine = [r for r in ranges if consumer.sources is None or r.source in consumer.sources]
            held = [
                (r.source, r.latest_offset - 1) for r in mine if r.latest_offset > r.earliest_offset
            ]
            if held:
                ledger, entry = max(held)
            else:
                ledger = min(consumer.sources) if consumer.sources else 0
                entry = ids.EARLIEST
            partition = min(consumer.sources) if consumer.sources else -1
            self.write(commands.last_message_id(request.request_id, ledger, entry, partition))

        self._spawn(cmd, answer())

    def _unsubscribe(self, cmd: Any, frame: frames.Frame) -> None:
        request = cmd.unsubscribe
        consumer = self._consumer(request.consumer_id)

        async def unsubscribe() -> None:
            await consumer.close()
            self.consumers.pop(request.consumer_id, None)
            await self.gateway.delete_subscription(consumer.subscription)
            self.write(commands.success(request.request_id))

        self._spawn(cmd, unsubscribe())

    def _seek(self, cmd: Any, frame: frames.Frame) -> None:
        request = cmd.seek
        consumer = self._consumer(request.consumer_id)
        if not request.HasField("message_publish_time") and not request.HasField("message_id"):
            raise PulsarError("NotAllowedError", "SEEK needs a message ID or a publish time")

        consumer.settle_acks()  # acks read before the SEEK apply before it

        async def seek() -> None:
            # As Pulsar does: answer, then close the consumer so the client subscribes again.
            # Deliveries the stream makes around the reset would reach the client while its
            # seek is in progress, and it drops those; closing gives them back instead.
            consumer.paused = True
            try:
                await self._seek_consumer(consumer, request)
            except PulsarError:
                consumer.paused = False
                consumer.flow(0)
                raise
            self.write(commands.success(request.request_id))
            if self.consumers.get(consumer.consumer_id) is consumer:
                del self.consumers[consumer.consumer_id]
                self.write(commands.close_consumer(consumer.consumer_id))
            await consumer.close()

        self._spawn(cmd, seek())

    async def _seek_consumer(self, consumer: Consumer, request: Any) -> None:
        """By message ID: that message's source from the message after it on (SeekOffsets; the
        client drops the message itself, so a reader, which acks what it is sent, is sent it
        and a durable consumer is not, which would hold it unacked). By publish time: the
        whole subscription (Seek, Google's rule: acked messages come back only within retention),
        or for a partition's consumer its source alone, from its first message at or after the
        time (SeekOffsets: anything the log still holds)."""
        if request.HasField("message_id"):
            await self._seek_to(
                consumer.subscription,
                consumer.topic,
                consumer.sources,
                request.message_id,
                after=not consumer.auto_ack,
            )
        elif consumer.sources is None:
            await self.gateway.seek_time(consumer.subscription, request.message_publish_time)
        else:
            found = await self.gateway.offsets_for_time(
                consumer.topic, request.message_publish_time
            )
            await self.gateway.seek_offsets(
                consumer.subscription, {s: found[s] for s in consumer.sources if s in found}
            )


# The transaction coordinator's commands (a client that enables transactions sends
# TC_CLIENT_CONNECT_REQUEST first): each answered with ERROR NotAllowedError naming transactions.
_TRANSACTION_COMMANDS = frozenset(
    Type.Value(name)
    for name in (
        "TC_CLIENT_CONNECT_REQUEST",
        "NEW_TXN",
        "ADD_PARTITION_TO_TXN",
        "ADD_SUBSCRIPTION_TO_TXN",
        "END_TXN",
        "END_TXN_ON_PARTITION",
        "END_TXN_ON_SUBSCRIPTION",
    )
)

# A reader's temporary subscription carries this label (not pubsubd-*: those are settings).
READER_LABEL = "pulsar-reader"


def _source_count(topic: Any) -> int:
    return publish_sources.parse(topic.labels).sources


def _partition_source(topic: names.TopicName, found: Any) -> int | None:
    """The publish message source a ``TOPIC-partition-N`` name means (None: the whole topic);
    NotAllowedError if the topic has no source N."""
    if topic.partition is None:
        return None
    count = _source_count(found)
    if topic.partition >= count:
        raise PulsarError(
            "NotAllowedError",
            f"{topic.pulsar}: the topic has {count} partition(s) (publish message sources "
            f"0..{count - 1})",
        )
    return topic.partition


def _invalid_name(e: names.InvalidName) -> PulsarError:
    """A name the front cannot map: NotAllowedError, which the C++ client does not retry (it
    retries InvalidTopicName until its operation timeout)."""
    return PulsarError("NotAllowedError", f"invalid name: {e}")


def _topic(name: str) -> names.TopicName:
    try:
        return names.parse_topic(name)
    except names.InvalidName as e:
        raise _invalid_name(e) from e
