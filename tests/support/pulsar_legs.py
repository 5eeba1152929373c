"""A Pulsar front consumer without a stream under it: unit and property tests feed its buffer
(ReceivedMessages as over gRPC, or RawDeliveries as in process) and read what it writes and
settles."""

from __future__ import annotations

from typing import Any

from pubsubd.core import ids as core_ids
from pubsubd.pulsar.consumers import Consumer
from pubsubd.pulsar.deliveries import DeliveryRun

INCARNATION = "inc"


class RecordingLeg:
    """Records what a consumer settles (as a StreamLeg would send it)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any], int | None]] = []

    def settle(self, acks: list[Any], nacks: list[Any], window: int | None) -> None:
        self.calls.append(("settle", names(acks + nacks), window))

    def set_window(self, window: int) -> None:
        self.calls.append(("window", [], window))

    def ready(self) -> list[Any]:
        return []  # deliveries are fed to the consumer's buffer by the test

    def give_back_unsent(self, deliveries: list[Any]) -> None:
        self.calls.append(("unsent", names(deliveries), None))

    async def give_back(self, deliveries: list[Any]) -> None:
        self.calls.append(("give_back", names(deliveries), None))

    async def close(self) -> None:
        self.calls.append(("close", [], None))


def names(refs: list[Any]) -> list[tuple[int, int]]:
    """The (position, generation) of each delivery ack IDs or raw deliveries name (a
    DeliveryRun names several)."""
    out: list[tuple[int, int]] = []
    for ref in refs:
        if isinstance(ref, str):
            out.append(core_ids.decode_ack_id(ref, INCARNATION))
        elif isinstance(ref, DeliveryRun):
            out += ref.pairs()
        else:
            out.append((int(ref[0]), int(ref[1])))
    return out


def recording_consumer(
    raw: bool, written: list[bytes], read_ahead: bool = True, **kw: Any
) -> Consumer:
    """A consumer (in process if ``raw``) that writes to ``written`` and settles on a
    RecordingLeg; without ``read_ahead`` an in-process one asks its stream for what a consumer
    over gRPC would (to compare their calls)."""
    consumer = Consumer(
        gateway=None,  # type: ignore[arg-type]  # never called: no stream is opened
        write=written.append,
        consumer_id=3,
        subscription="projects/p/subscriptions/s",
        client_id="c",
        cumulative_ok=True,
        open_in_process=(lambda *a: None) if raw else None,  # type: ignore[arg-type,return-value]
        **kw,
    )
    consumer._leg = RecordingLeg()  # type: ignore[assignment]
    if not read_ahead:
        consumer._read_ahead_max = 0
    return consumer
