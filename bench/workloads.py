"""The measurements themselves; each runs in a fresh ``bench.worker`` process against one endpoint.

The official client reaches the target through ``PUBSUB_EMULATOR_HOST`` (set by the runner), the
raw clients through ``grpc.aio`` channels to ``endpoint``. Every workload creates its own topic and
subscription (``names``: many of each, in a project of its own), is bounded by a message count and
a time limit, deletes what it created, and returns a flat dict of numbers. The measured section is
timed with ``Meter``, which also reads the CPU time this process and the server process used
during it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench import pb

PROJECT = "bench"
NULL_PREBUILT_LABEL = "null-prebuilt"
NULL_SIZE_LABEL = "null-size"
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]
ADMIN_TIMEOUT_S = 30.0
RPC_TIMEOUT_S = 60.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")
# More processes of the target whose CPU every Meter reads, by name (a cluster's storage nodes
# and ZooKeeper; ``bench.worker`` fills it from the spec's ``watch``). They are not "other".
WATCHED: dict[str, int] = {}

Result = dict[str, Any]


# --- measuring ---------------------------------------------------------------------------------


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (all threads), from /proc; None if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the ")" that ends comm: field 3 (state) is index 0, so utime/stime are 11 and 12.
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def machine_busy_s() -> float:
    """CPU seconds all CPUs of the machine spent busy since boot (from /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK


@dataclass
class Meter:
    """Wall time and CPU time of one measured section: this process (the client), the server
    process, and everything else on the machine (other users' load skews the figures)."""

    server_pid: int | None
    start: float = 0.0
    elapsed_s: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None
    machine_cpu_s: float = 0.0
    watched_cpu_s: dict[str, float] = field(default_factory=dict)
    _client0: float = 0.0
    _server0: float | None = None
    _machine0: float = 0.0
    _watched0: dict[str, float] = field(default_factory=dict)

    def begin(self) -> None:
        self._machine0 = machine_busy_s()
        self._client0 = _self_cpu_s()
        self._server0 = process_cpu_s(self.server_pid) if self.server_pid else None
        self._watched0 = _watched_cpu_s()
        self.start = time.perf_counter()

    def end(self) -> None:
        self.elapsed_s = time.perf_counter() - self.start
        self.client_cpu_s = _self_cpu_s() - self._client0
        if self.server_pid and self._server0 is not None:
            server1 = process_cpu_s(self.server_pid)
            if server1 is not None:
                self.server_cpu_s = server1 - self._server0
        watched1 = _watched_cpu_s()
        self.watched_cpu_s = {
            k: watched1[k] - v for k, v in self._watched0.items() if k in watched1
        }
        self.machine_cpu_s = machine_busy_s() - self._machine0

    def cpu(self) -> Result:
        """CPU use during the section, in % of one core."""
        elapsed = max(self.elapsed_s, 1e-9)
        out: Result = {
            "elapsed_s": round(self.elapsed_s, 4),
            "client_cpu_pct": 100.0 * self.client_cpu_s / elapsed,
        }
        other = self.machine_cpu_s - self.client_cpu_s
        if self.server_cpu_s is not None:
            out["server_cpu_pct"] = 100.0 * self.server_cpu_s / elapsed
            other -= self.server_cpu_s
        if self.watched_cpu_s:
            out["watched_cpu_pct"] = {
                k: 100.0 * v / elapsed for k, v in sorted(self.watched_cpu_s.items())
            }
            other -= sum(self.watched_cpu_s.values())
        out["other_cpu_pct"] = max(0.0, 100.0 * other / elapsed)
        return out

    def result(self, messages: int, size: int) -> Result:
        elapsed = max(self.elapsed_s, 1e-9)
        return {
            "messages": messages,
            "msgs_per_s": messages / elapsed,
            "mb_per_s": messages * size / elapsed / 1e6,
            **self.cpu(),
        }


def _self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _watched_cpu_s() -> dict[str, float]:
    out = {}
    for name, pid in WATCHED.items():
        cpu = process_cpu_s(pid)
        if cpu is not None:
            out[name] = cpu
    return out


# --- topics and subscriptions ------------------------------------------------------------------


@dataclass
class Resources:
    """A topic and one subscription on it, created with the official client, deleted after."""

    tag: str
    labels: dict[str, str] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # more Subscription fields
    topic: str = ""
    subscription: str = ""

    def __post_init__(self) -> None:
        suffix = uuid.uuid4().hex[:10]
        self.topic = f"projects/{PROJECT}/topics/{self.tag}-{suffix}"
        self.subscription = f"projects/{PROJECT}/subscriptions/{self.tag}-{suffix}"


@contextlib.contextmanager
def resources(
    tag: str, labels: dict[str, str] | None = None, options: dict[str, Any] | None = None
) -> Iterator[Resources]:
    from google.cloud import pubsub_v1

    res = Resources(tag, labels or {}, options or {})
    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    try:
        publisher.create_topic(name=res.topic, timeout=ADMIN_TIMEOUT_S)
        subscriber.create_subscription(
            request={
                "name": res.subscription,
                "topic": res.topic,
                "ack_deadline_seconds": 60,
                "labels": res.labels,
                **res.options,
            },
            timeout=ADMIN_TIMEOUT_S,
        )
        yield res
    finally:
        # Best effort: the target is stopped at the end of the session anyway.
        with contextlib.suppress(Exception):
            subscriber.delete_subscription(subscription=res.subscription, timeout=ADMIN_TIMEOUT_S)
        with contextlib.suppress(Exception):
            publisher.delete_topic(topic=res.topic, timeout=ADMIN_TIMEOUT_S)
        with contextlib.suppress(Exception):
            subscriber.close()
        with contextlib.suppress(Exception):
            publisher.stop()


def _run_async(coro: Awaitable[Result]) -> Result:
    async def main() -> Result:
        return await coro

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a pubsubd dependency on Linux
        return asyncio.run(main())
    return uvloop.run(main())


# --- 1. publish throughput -------------------------------------------------------------------


def publish_client(
    endpoint: str, server_pid: int | None, *, size: int, count: int, time_limit_s: float
) -> Result:
    """Official PublisherClient: publish ``count`` messages as fast as possible, wait all futures.

    Batch settings are the defaults (max_bytes 1 MB, max_latency 10 ms) except max_messages=1000.
    """
    from google.cloud import pubsub_v1

    with resources("pubclient") as res:
        publisher = pubsub_v1.PublisherClient(
            batch_settings=pubsub_v1.types.BatchSettings(max_messages=1000, max_latency=0.01)
        )
        data = b"x" * size
        # Warm the channel up (connection, first-RPC costs) before timing.
        publisher.publish(res.topic, data).result(timeout=RPC_TIMEOUT_S)
        meter = Meter(server_pid)
        pending: list[futures.Future[str]] = []
        meter.begin()
        deadline = meter.start + time_limit_s
        for i in range(count):
            pending.append(publisher.publish(res.topic, data))
            if i % 1000 == 999 and time.perf_counter() > deadline:
                break
        done, not_done = futures.wait(
            pending, timeout=max(1.0, deadline - time.perf_counter() + 10.0)
        )
        meter.end()
        ok = sum(1 for f in done if f.exception() is None)
        out = meter.result(ok, size)
        out.update(
            sent=len(pending),
            failed=len(done) - ok,
            unfinished=len(not_done),
            complete=ok == count,
        )
        publisher.stop()
        return out


async def raw_publish(
    endpoint: str,
    topic: str,
    *,
    size: int,
    count: int,
    batch: int,
    concurrency: int,
    deadline: float,
    attributes: str = "",
    keys: int = 0,
) -> int:
    """Publish ``count`` messages in pre-serialized batches, ``concurrency`` RPCs in flight.

    Messages carry the attribute set ``attributes`` (``pb.ATTRIBUTES``); with ``keys``, each
    request has one ordering key, round-robin over ``keys`` keys. Stops issuing new batches at
    ``deadline`` (perf_counter); returns messages acknowledged.
    """
    async with grpc.aio.insecure_channel(endpoint, options=CHANNEL_OPTIONS) as channel:
        publish = channel.unary_unary(
            pb.PUBLISH, request_serializer=None, response_deserializer=pb.PublishResponse.FromString
        )
        n = count // batch
        if keys:
            distinct = [
                pb.publish_request(topic, batch, size, attributes, f"key-{k}")
                for k in range(min(keys, n))
            ]
            batches = [distinct[j % keys] for j in range(n)]
        else:
            batches = [pb.publish_request(topic, batch, size, attributes)] * n
        if count % batch:
            key = f"key-{n % keys}" if keys else ""
            batches.append(pb.publish_request(topic, count % batch, size, attributes, key))
        queue = iter(batches)
        acked = 0

        async def sender() -> None:
            nonlocal acked
            for request in queue:
                if time.perf_counter() > deadline:
                    return
                response = await publish(request, timeout=RPC_TIMEOUT_S)
                acked += len(response.message_ids)

        await asyncio.gather(*(sender() for _ in range(concurrency)))
        return acked


def publish_raw(
    endpoint: str,
    server_pid: int | None,
    *,
    size: int,
    count: int,
    batch: int,
    concurrency: int,
    time_limit_s: float,
    attributes: str = "",
) -> Result:
    """Raw grpc.aio publisher: pre-serialized PublishRequests of ``batch`` messages (with the
    attribute set ``attributes``)."""

    async def run(topic: str) -> Result:
        # Warm-up batch: connection setup is not part of the figure.
        await raw_publish(
            endpoint,
            topic,
            size=size,
            count=batch,
            batch=batch,
            concurrency=1,
            deadline=1e18,
            attributes=attributes,
        )
        meter = Meter(server_pid)
        meter.begin()
        acked = await raw_publish(
            endpoint,
            topic,
            size=size,
            count=count,
            batch=batch,
            concurrency=concurrency,
            deadline=meter.start + time_limit_s,
            attributes=attributes,
        )
        meter.end()
        out = meter.result(acked, size)
        out.update(complete=acked == count)
        return out

    with resources("pubraw") as res:
        return _run_async(run(res.topic))


# --- 2. end-to-end latency ---------------------------------------------------------------------


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q / 100.0 * (len(sorted_values) - 1))))
    return sorted_values[k]


def latency(
    endpoint: str,
    server_pid: int | None,
    *,
    rate: int,
    duration_s: float,
    warmup_s: float,
    size: int,
) -> Result:
    """Paced official publisher -> server -> official subscribe() callback (which acks).

    Every message carries its send time (``time.time_ns()`` just before ``publish()``) as the
    attribute ``sent_ns``; latency = callback time - send time. Messages sent during the first
    ``warmup_s`` seconds are excluded. Default publisher batch settings (max_latency 10 ms).
    """
    from google.cloud import pubsub_v1

    with resources("latency") as res:
        subscriber = pubsub_v1.SubscriberClient()
        publisher = pubsub_v1.PublisherClient()
        lock = threading.Lock()
        samples: list[tuple[int, int]] = []  # (sent_ns, latency_ns)
        seen: set[str] = set()
        probe_seen = threading.Event()

        def callback(message: Any) -> None:
            now = time.time_ns()
            message.ack()
            sent = message.attributes.get("sent_ns")
            if sent is None:
                probe_seen.set()
                return
            with lock:
                if message.message_id not in seen:
                    seen.add(message.message_id)
                    samples.append((int(sent), now - int(sent)))

        stream = subscriber.subscribe(res.subscription, callback)
        try:
            # The stream is open once a probe comes back (the null server drops messages
            # published while no stream is open, so probe until one arrives).
            probe_deadline = time.monotonic() + 30.0
            while not probe_seen.is_set() and time.monotonic() < probe_deadline:
                publisher.publish(res.topic, b"probe").result(timeout=RPC_TIMEOUT_S)
                probe_seen.wait(0.2)
            data = b"x" * size
            total = int(rate * (warmup_s + duration_s))
            meter = Meter(server_pid)
            meter.begin()
            t0 = meter.start
            measure_from_ns = time.time_ns() + int(warmup_s * 1e9)
            behind = 0
            for i in range(total):
                delay = t0 + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                elif delay < -0.005:
                    behind += 1
                publisher.publish(res.topic, data, sent_ns=str(time.time_ns()))
            send_elapsed = time.perf_counter() - t0
            wait_until = time.monotonic() + 10.0
            while time.monotonic() < wait_until:
                with lock:
                    if len(samples) >= total:
                        break
                time.sleep(0.02)
            meter.end()
        finally:
            stream.cancel()
            with contextlib.suppress(Exception):
                stream.result(timeout=10)
            publisher.stop()
            subscriber.close()
        with lock:
            measured = sorted(lat / 1e6 for sent, lat in samples if sent >= measure_from_ns)
            received = len(samples)
        expected = total - int(rate * warmup_s)
        return {
            "sent": total,
            "received": received,
            "lost": total - received,
            "measured": len(measured),
            "expected_measured": expected,
            "send_rate": total / send_elapsed,
            "late_sends": behind,
            "p50_ms": _percentile(measured, 50),
            "p90_ms": _percentile(measured, 90),
            "p99_ms": _percentile(measured, 99),
            "p999_ms": _percentile(measured, 99.9),
            "max_ms": measured[-1] if measured else float("nan"),
            "mean_ms": statistics.fmean(measured) if measured else float("nan"),
            **meter.cpu(),
        }


def publish_latency(
    endpoint: str,
    server_pid: int | None,
    *,
    rate: int,
    batch: int,
    duration_s: float,
    warmup_s: float,
    size: int,
) -> Result:
    """The publish acknowledgement alone: raw Publish RPCs of ``batch`` messages of ``size``
    bytes, ``rate`` messages per second, sent open loop from one ``grpc.aio`` channel (each RPC
    its own task, so a slow answer does not hold the next send back). Latency = answer time -
    call time, both ``perf_counter`` in this process: the server's durable write (in a cluster,
    the replication to the ack quorum) plus one loopback round trip, without the official
    client's batch timer and subscriber. RPCs sent during the first ``warmup_s`` s are excluded."""

    async def run(topic: str) -> Result:
        async with grpc.aio.insecure_channel(endpoint, options=CHANNEL_OPTIONS) as channel:
            publish = channel.unary_unary(
                pb.PUBLISH,
                request_serializer=None,
                response_deserializer=pb.PublishResponse.FromString,
            )
            request = pb.publish_request(topic, batch, size)
            rpcs_per_s = rate / batch
            for _ in range(20):  # connection and first-RPC costs are not part of the figure
                await publish(request, timeout=RPC_TIMEOUT_S)
            total = int(rpcs_per_s * (warmup_s + duration_s))
            first_measured = int(rpcs_per_s * warmup_s)
            samples: list[float] = []
            failures = 0
            behind = 0
            pending: set[asyncio.Task[None]] = set()

            async def one(i: int) -> None:
                nonlocal failures
                sent = time.perf_counter()
                try:
                    await publish(request, timeout=RPC_TIMEOUT_S)
                except grpc.aio.AioRpcError:
                    failures += 1
                    return
                if i >= first_measured:
                    samples.append((time.perf_counter() - sent) * 1e3)

            meter = Meter(server_pid)
            meter.begin()
            t0 = meter.start
            for i in range(total):
                delay = t0 + i / rpcs_per_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -0.005:
                    behind += 1
                task = asyncio.ensure_future(one(i))
                pending.add(task)
                task.add_done_callback(pending.discard)
            send_elapsed = time.perf_counter() - t0
            if pending:
                await asyncio.wait(list(pending), timeout=RPC_TIMEOUT_S)
            meter.end()
            measured = sorted(samples)
            return {
                "sent_rpcs": total,
                "messages": total * batch,
                "failed": failures,
                # measured-window RPCs that failed or got no answer within the wait
                "lost": total - first_measured - len(measured),
                "measured": len(measured),
                "send_rate": total / send_elapsed,
                "late_sends": behind,
                "p50_ms": _percentile(measured, 50),
                "p90_ms": _percentile(measured, 90),
                "p99_ms": _percentile(measured, 99),
                "p999_ms": _percentile(measured, 99.9),
                "max_ms": measured[-1] if measured else float("nan"),
                "mean_ms": statistics.fmean(measured) if measured else float("nan"),
                **meter.cpu(),
            }

    with resources("publat") as res:
        return _run_async(run(res.topic))


# --- 3. backlog drain --------------------------------------------------------------------------


def _backlog(
    endpoint: str,
    topic: str,
    *,
    size: int,
    count: int,
    batch: int = 1000,
    attributes: str = "",
    keys: int = 0,
) -> int:
    async def run() -> Result:
        acked = await raw_publish(
            endpoint,
            topic,
            size=size,
            count=count,
            batch=batch,
            concurrency=4,
            deadline=time.perf_counter() + 120.0,
            attributes=attributes,
            keys=keys,
        )
        return {"acked": acked}

    return int(_run_async(run())["acked"])


def _drain_labels(count: int, size: int) -> dict[str, str]:
    # Only the null server reads these; the others just store them.
    return {NULL_PREBUILT_LABEL: str(count), NULL_SIZE_LABEL: str(size)}


def drain_client(
    endpoint: str,
    server_pid: int | None,
    *,
    count: int,
    size: int,
    max_messages: int,
    time_limit_s: float,
) -> Result:
    """Backlog of ``count`` messages, then the official subscribe() (callback acks) until all are
    received. FlowControl(max_messages=``max_messages``)."""
    from google.cloud import pubsub_v1

    with resources("drainclient", _drain_labels(count, size)) as res:
        backlog = _backlog(endpoint, res.topic, size=size, count=count)
        subscriber = pubsub_v1.SubscriberClient()
        lock = threading.Lock()
        seen: set[str] = set()
        deliveries = 0
        all_in = threading.Event()

        def callback(message: Any) -> None:
            nonlocal deliveries
            message.ack()
            with lock:
                deliveries += 1
                seen.add(message.message_id)
                if len(seen) >= count:
                    all_in.set()

        meter = Meter(server_pid)
        meter.begin()
        stream = subscriber.subscribe(
            res.subscription,
            callback,
            flow_control=pubsub_v1.types.FlowControl(max_messages=max_messages),
        )
        all_in.wait(time_limit_s)
        meter.end()
        stream.cancel()
        with contextlib.suppress(Exception):
            stream.result(timeout=10)
        subscriber.close()
        with lock:
            received, total = len(seen), deliveries
        out = meter.result(received, size)
        out.update(backlog=backlog, duplicates=total - received, complete=received >= count)
        return out


def drain_raw(
    endpoint: str,
    server_pid: int | None,
    *,
    count: int,
    size: int,
    max_messages: int,
    time_limit_s: float,
    batch: int = 1000,
    attributes: str = "",
    keys: int = 0,
    filter_half: bool = False,
    ordering: bool = False,
    timed_from_first: bool = False,
) -> Result:
    """Backlog of ``count`` messages, then one raw StreamingPull with unary Acknowledge calls
    (up to 1000 ack ids each, not awaited one by one) until all are received and acked.

    Feature variants: the backlog is published in requests of ``batch`` messages with the
    attribute set ``attributes`` and ``keys`` ordering keys (one per request, round-robin); the
    subscription has the filter ``pb.HALF_FILTER`` (``filter_half``: half the messages are
    delivered, the rest never are) and/or ``enable_message_ordering``. With ordering, the first
    delivery of each message must come in message-ID order within its key (checked). With
    ``timed_from_first`` the clock starts at the first message received (delayed backlogs: the
    stream is open while the messages wait, and the rate is that of their falling due)."""
    expected = count // 2 if filter_half else count

    async def run(res: Resources, backlog: int) -> Result:
        async with grpc.aio.insecure_channel(endpoint, options=CHANNEL_OPTIONS) as channel:
            streaming_pull, acknowledge = pb.subscriber_stubs(channel)
            acks: set[asyncio.Task[Any]] = set()
            seen: set[str] = set()
            deliveries = 0
            last_by_key: dict[str, int] = {}
            order_violations = 0
            meter = Meter(server_pid)
            meter.begin()
            deadline = meter.start + time_limit_s
            call = streaming_pull()
            await call.write(
                pb.StreamingPullRequest(
                    subscription=res.subscription,
                    stream_ack_deadline_seconds=60,
                    max_outstanding_messages=max_messages,
                    client_id=uuid.uuid4().hex,
                )
            )
            try:
                while len(seen) < expected:
                    remaining = deadline - time.perf_counter()
                    if remaining <= 0:
                        break
                    try:
                        response = await asyncio.wait_for(call.read(), remaining)
                    except TimeoutError:
                        break
                    if response is grpc.aio.EOF:
                        break
                    if timed_from_first and not seen:
                        meter.begin()
                        deadline = meter.start + time_limit_s
                    ack_ids = []
                    for received in response.received_messages:
                        ack_ids.append(received.ack_id)
                        message = received.message
                        if ordering and message.message_id not in seen:
                            key, mid = message.ordering_key, int(message.message_id)
                            if mid <= last_by_key.get(key, -1):
                                order_violations += 1
                            last_by_key[key] = mid
                        seen.add(message.message_id)
                    deliveries += len(ack_ids)
                    for i in range(0, len(ack_ids), 1000):
                        request = pb.AcknowledgeRequest(
                            subscription=res.subscription, ack_ids=ack_ids[i : i + 1000]
                        )
                        task = asyncio.ensure_future(acknowledge(request, timeout=RPC_TIMEOUT_S))
                        acks.add(task)
                        task.add_done_callback(acks.discard)
                if acks:
                    await asyncio.wait(list(acks), timeout=max(1.0, deadline - time.perf_counter()))
                meter.end()
            finally:
                call.cancel()
            out = meter.result(len(seen), size)
            out.update(
                backlog=backlog,
                # backlog messages consumed per second (delivered or filtered out)
                backlog_per_s=backlog / max(meter.elapsed_s, 1e-9) if len(seen) >= expected else 0,
                duplicates=deliveries - len(seen),
                complete=len(seen) >= expected,
                unfinished_acks=len(acks),
            )
            if ordering:
                out.update(order_violations=order_violations, keys_seen=len(last_by_key))
            return out

    options: dict[str, Any] = {}
    if filter_half:
        options["filter"] = pb.HALF_FILTER
    if ordering:
        options["enable_message_ordering"] = True
    with resources("drainraw", _drain_labels(count, size), options) as res:
        backlog = _backlog(
            endpoint,
            res.topic,
            size=size,
            count=count,
            batch=batch,
            attributes=attributes,
            keys=keys,
        )
        return _run_async(run(res, backlog))


# --- 4. many names ----------------------------------------------------------------------------


def process_status(pid: int) -> dict[str, int]:
    """VmRSS (kB) and open file descriptors of process ``pid``."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return {"rss_kb": rss, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def server_data_dir(pid: int) -> Path | None:
    """pubsubd's ``--data-dir``, from its command line (None for other servers)."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    if "--data-dir" not in args:
        return None
    path = Path(args[args.index("--data-dir") + 1])
    return path if path.is_absolute() else Path(f"/proc/{pid}/cwd") / path


def tree_usage(path: Path) -> dict[str, int]:
    """Disk usage (kB allocated, like du) and number of files and directories under ``path``."""
    blocks = entries = 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                blocks += os.lstat(os.path.join(root, name)).st_blocks
            entries += 1
    with contextlib.suppress(OSError):
        blocks += os.lstat(path).st_blocks
    return {"data_kb": blocks // 2, "data_entries": entries}


def names(
    endpoint: str,
    server_pid: int | None,
    *,
    topics: int,
    subs_per_topic: int,
    threads: int,
    idle_s: float,
    time_limit_s: float,
) -> Result:
    """Many topics and subscriptions through the official clients: create ``topics`` topics and
    ``subs_per_topic`` subscriptions on each (``threads`` threads of blocking calls), list them
    all with paging (1000 per page), delete them all. Each phase reports names per second and
    CPU. Server RSS, open fds and data-dir size are read before, after creation (and after
    ``idle_s`` of idling, with the server's CPU meanwhile: its periodic work per name) and after
    deletion. Everything lives in a fresh project, so the listings count exactly these."""
    from google.cloud import pubsub_v1

    project = f"projects/names-{uuid.uuid4().hex[:8]}"
    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    topic_names = [f"{project}/topics/t{i:07d}" for i in range(topics)]
    sub_names = [
        (f"{project}/subscriptions/s{i:07d}-{k:03d}", t)
        for i, t in enumerate(topic_names)
        for k in range(subs_per_topic)
    ]
    deadline = time.perf_counter() + time_limit_s
    out: Result = {"topics": topics, "subscriptions": len(sub_names)}

    def snapshot(stage: str) -> None:
        if not server_pid:
            return
        status = process_status(server_pid)
        out[f"rss_mb_{stage}"] = status["rss_kb"] / 1024
        out[f"fds_{stage}"] = status["fds"]
        data_dir = server_data_dir(server_pid)
        if data_dir is not None:
            usage = tree_usage(data_dir)
            out[f"data_mb_{stage}"] = usage["data_kb"] / 1024
            out[f"data_entries_{stage}"] = usage["data_entries"]

    def phase(name: str, call: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """Run ``call`` on every item from ``threads`` threads; return the items that worked."""
        done: list[Any] = []
        errors: list[str] = []
        meter = Meter(server_pid)
        meter.begin()

        def one(item: Any) -> None:
            if time.perf_counter() > deadline:
                return
            try:
                call(item)
                done.append(item)
            except Exception as e:  # counted and reported; the run goes on
                errors.append(type(e).__name__)

        with futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, items))
        meter.end()
        cpu = meter.cpu()
        out[f"{name}_per_s"] = len(done) / max(meter.elapsed_s, 1e-9)
        out[f"{name}_s"] = meter.elapsed_s
        out[f"{name}_server_cpu_pct"] = cpu.get("server_cpu_pct")
        out[f"{name}_client_cpu_pct"] = cpu["client_cpu_pct"]
        out[f"{name}_errors"] = len(errors)
        if errors:
            out[f"{name}_error_kinds"] = sorted(set(errors))
        return done

    def listing(name: str, pages: Callable[[], Any]) -> None:
        meter = Meter(server_pid)
        meter.begin()
        count = sum(1 for _ in pages())
        meter.end()
        out[f"{name}_per_s"] = count / max(meter.elapsed_s, 1e-9)
        out[f"{name}_s"] = meter.elapsed_s
        out[f"{name}_count"] = count
        out[f"{name}_server_cpu_pct"] = meter.cpu().get("server_cpu_pct")

    try:
        snapshot("before")
        created_topics = phase(
            "create_topics",
            lambda t: publisher.create_topic(name=t, timeout=ADMIN_TIMEOUT_S),
            topic_names,
        )
        live = set(created_topics)
        created_subs = phase(
            "create_subs",
            lambda st: subscriber.create_subscription(
                name=st[0], topic=st[1], timeout=ADMIN_TIMEOUT_S
            ),
            [st for st in sub_names if st[1] in live],
        )
        snapshot("created")
        if server_pid and idle_s > 0:
            meter = Meter(server_pid)
            meter.begin()
            time.sleep(idle_s)
            meter.end()
            out["idle_server_cpu_pct"] = meter.cpu().get("server_cpu_pct")
            snapshot("idle")
        listing(
            "list_topics",
            lambda: publisher.list_topics(
                request={"project": project, "page_size": 1000}, timeout=ADMIN_TIMEOUT_S
            ),
        )
        listing(
            "list_subs",
            lambda: subscriber.list_subscriptions(
                request={"project": project, "page_size": 1000}, timeout=ADMIN_TIMEOUT_S
            ),
        )
        deadline = max(deadline, time.perf_counter() + time_limit_s)  # always clean up
        phase(
            "delete_subs",
            lambda st: subscriber.delete_subscription(subscription=st[0], timeout=ADMIN_TIMEOUT_S),
            created_subs,
        )
        phase(
            "delete_topics",
            lambda t: publisher.delete_topic(topic=t, timeout=ADMIN_TIMEOUT_S),
            created_topics,
        )
        snapshot("deleted")
    finally:
        with contextlib.suppress(Exception):
            subscriber.close()
        with contextlib.suppress(Exception):
            publisher.stop()
    out["complete"] = (
        len(created_topics) == topics
        and len(created_subs) == len(sub_names)
        and out.get("list_topics_count") == topics
        and out.get("list_subs_count") == len(sub_names)
        and not out.get("delete_subs_errors")
        and not out.get("delete_topics_errors")
    )
    for key in ("rss_mb", "data_mb", "fds"):
        if f"{key}_created" in out and len(sub_names) + topics:
            delta = out[f"{key}_created"] - out[f"{key}_before"]
            out[f"{key}_per_1k_names"] = 1000 * delta / (topics + len(sub_names))
    return out


WORKLOADS: dict[str, Callable[..., Result]] = {
    "publish_client": publish_client,
    "publish_raw": publish_raw,
    "latency": latency,
    "publish_latency": publish_latency,
    "drain_client": drain_client,
    "drain_raw": drain_raw,
    "names": names,
}
