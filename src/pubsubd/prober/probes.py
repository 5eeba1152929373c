"""The probes (issue 12): what a client does, done on a schedule against one endpoint, timed,
with the step that failed named.

* ``publish_receive`` (data plane): publish one message carrying a probe ID to the prober's
  topic, pull the prober's subscription until that message arrives, acknowledge what came. The
  latency is from the publish call to the message in hand.
* ``control_plane``: create a topic, get it, update its labels, create a subscription on it, get
  it, update its ack deadline, delete the subscription, delete the topic. The latency is the
  whole sequence; whatever was created is deleted even when a step fails.

Each probe uses the official client library's generated clients (``google.pubsub_v1``) over a
plain-text channel, as ``PUBSUB_EMULATOR_HOST`` makes the official clients do, one attempt per
call (no retries: a failure the client library would retry is what a probe is there to see).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pubsubd.core.client_security import ClientSecurity

__all__ = ["CONTROL_PLANE", "PUBLISH_RECEIVE", "Clients", "ProbeResult", "control_plane"]

PUBLISH_RECEIVE = "publish_receive"
CONTROL_PLANE = "control_plane"
PROBE_ID = "pubsubd-probe-id"
# A call of a probe waits at most this long; a message not received within RECEIVE_WITHIN_S
# fails the data-plane probe.
CALL_TIMEOUT_S = 10.0
RECEIVE_WITHIN_S = 10.0


@dataclass(frozen=True, slots=True)
class ProbeResult:
    probe: str
    endpoint: str
    ok: bool
    latency_s: float
    at_unix_s: float
    error: str = ""  # "<step>: <what went wrong>" when it failed

    def as_dict(self) -> dict[str, Any]:
        return {
            "probe": self.probe,
            "endpoint": self.endpoint,
            "ok": self.ok,
            "latency_s": round(self.latency_s, 6),
            "at_unix_s": self.at_unix_s,
            "error": self.error,
        }


class Clients:
    """The official generated clients on one endpoint (plain-text gRPC, or TLS and a token
    as ``security`` says)."""

    def __init__(self, endpoint: str, security: ClientSecurity | None = None) -> None:
        from google.pubsub_v1 import PublisherClient, SubscriberClient
        from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

        self.endpoint = endpoint
        security = security or ClientSecurity()
        self._channels = [security.channel(endpoint) for _ in range(2)]
        self.publisher = PublisherClient(
            transport=PublisherGrpcTransport(channel=self._channels[0])
        )
        self.subscriber = SubscriberClient(
            transport=SubscriberGrpcTransport(channel=self._channels[1])
        )

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


class _Failed(Exception):
    def __init__(self, step: str, cause: BaseException | str) -> None:
        super().__init__(f"{step}: {_describe(cause)}")


def _describe(cause: BaseException | str) -> str:
    if isinstance(cause, str):
        return cause
    code = getattr(cause, "grpc_status_code", None)  # google.api_core's exceptions
    message = getattr(cause, "message", None) or str(cause)
    name = getattr(code, "name", None) or type(cause).__name__
    return f"{name} {message}".strip()


def _step(step: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as e:
        raise _Failed(step, e) from e


def _result(probe: str, endpoint: str, started: float, at: float, error: str = "") -> ProbeResult:
    return ProbeResult(probe, endpoint, not error, time.monotonic() - started, at, error)


def prober_names(project: str, endpoint: str) -> tuple[str, str]:
    """The data-plane probe's topic, and its subscription for ``endpoint`` (one per endpoint,
    so probes through different frontends never take each other's messages)."""
    tag = hashlib.blake2b(endpoint.encode(), digest_size=5).hexdigest()
    return (
        f"projects/{project}/topics/pubsubd-prober",
        f"projects/{project}/subscriptions/pubsubd-prober-{tag}",
    )


def ensure_data_plane(clients: Clients, project: str) -> None:
    """Create the probe's topic and subscription if missing."""
    from google.api_core import exceptions

    topic, subscription = prober_names(project, clients.endpoint)
    with contextlib.suppress(exceptions.AlreadyExists):
        clients.publisher.create_topic(name=topic, timeout=CALL_TIMEOUT_S, retry=None)
    with contextlib.suppress(exceptions.AlreadyExists):
        clients.subscriber.create_subscription(
            name=subscription,
            topic=topic,
            ack_deadline_seconds=10,
            timeout=CALL_TIMEOUT_S,
            retry=None,
        )


def publish_receive(clients: Clients, project: str) -> ProbeResult:
    from google.pubsub_v1.types import PubsubMessage

    at, started = time.time(), time.monotonic()
    topic, subscription = prober_names(project, clients.endpoint)
    probe_id = uuid.uuid4().hex
    try:
        _step("setup", lambda: ensure_data_plane(clients, project))
        started = time.monotonic()  # the setup is done once: not part of the latency
        _step(
            "publish",
            lambda: clients.publisher.publish(
                topic=topic,
                messages=[PubsubMessage(data=b"probe", attributes={PROBE_ID: probe_id})],
                timeout=CALL_TIMEOUT_S,
                retry=None,
            ),
        )
        deadline = started + RECEIVE_WITHIN_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Failed("receive", f"not delivered within {RECEIVE_WITHIN_S:g} s")
            response = _step(
                "receive",
                functools.partial(
                    clients.subscriber.pull,
                    subscription=subscription,
                    max_messages=100,
                    timeout=min(CALL_TIMEOUT_S, max(left, 0.5)),
                    retry=None,
                ),
            )
            got = response.received_messages
            if got:
                _step(
                    "acknowledge",
                    functools.partial(
                        clients.subscriber.acknowledge,
                        subscription=subscription,
                        ack_ids=[m.ack_id for m in got],
                        timeout=CALL_TIMEOUT_S,
                        retry=None,
                    ),
                )
            if any(m.message.attributes.get(PROBE_ID) == probe_id for m in got):
                return _result(PUBLISH_RECEIVE, clients.endpoint, started, at)
    except _Failed as e:
        return _result(PUBLISH_RECEIVE, clients.endpoint, started, at, str(e))


def control_plane(clients: Clients, project: str) -> ProbeResult:
    at, started = time.time(), time.monotonic()
    suffix = uuid.uuid4().hex[:10]
    topic = f"projects/{project}/topics/pubsubd-prober-cp-{suffix}"
    subscription = f"projects/{project}/subscriptions/pubsubd-prober-cp-{suffix}"
    pub, sub, t = clients.publisher, clients.subscriber, CALL_TIMEOUT_S
    made: list[tuple[Callable[..., Any], dict[str, str]]] = []
    error = ""
    try:
        _step("create topic", lambda: pub.create_topic(name=topic, timeout=t, retry=None))
        made.append((pub.delete_topic, {"topic": topic}))
        _step("get topic", lambda: pub.get_topic(topic=topic, timeout=t, retry=None))
        _step(
            "update topic",
            lambda: pub.update_topic(
                request={
                    "topic": {"name": topic, "labels": {"probe": suffix}},
                    "update_mask": {"paths": ["labels"]},
                },
                timeout=t,
                retry=None,
            ),
        )
        _step(
            "create subscription",
            lambda: sub.create_subscription(name=subscription, topic=topic, timeout=t, retry=None),
        )
        made.append((sub.delete_subscription, {"subscription": subscription}))
        _step(
            "get subscription",
            lambda: sub.get_subscription(subscription=subscription, timeout=t, retry=None),
        )
        _step(
            "update subscription",
            lambda: sub.update_subscription(
                request={
                    "subscription": {"name": subscription, "ack_deadline_seconds": 20},
                    "update_mask": {"paths": ["ack_deadline_seconds"]},
                },
                timeout=t,
                retry=None,
            ),
        )
        while made:
            delete, target = made.pop()
            step = "delete subscription" if "subscription" in target else "delete topic"
            _step(step, functools.partial(delete, **target, timeout=t, retry=None))
    except _Failed as e:
        error = str(e)
    for delete, target in reversed(made):  # what a failed step left behind: best effort
        with contextlib.suppress(Exception):
            delete(**target, timeout=t, retry=None)
    return _result(CONTROL_PLANE, clients.endpoint, started, at, error)
