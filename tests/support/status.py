"""The server's ``/status`` page for tests: the whole page, one subscription's entry, and waiting
for the publishing forwarder's next trim passes instead of sleeping through them."""

from __future__ import annotations

import json
from typing import Any

from tests.support.raw import http_get
from tests.support.server import ServerProcess, wait_for

# PUBSUBD_TRIM_INTERVAL_S for tests that wait for trim passes: one every 0.2 s instead of 2 s.
FAST_TRIM_INTERVAL_S = "0.2"


def status(server: ServerProcess) -> dict[str, Any]:
    """The server's /status JSON (a cluster's forwarders' merged, ``ClusterServer.status``)."""
    merged = getattr(server, "status", None)
    if merged is not None:
        return dict(merged())
    _, body = http_get(server, "/status", timeout=10)
    return dict(json.loads(body))


def sub_status(server: ServerProcess, subscription: str) -> dict[str, Any]:
    """The server's /status entry for one subscription ({} if it has none)."""
    return dict(status(server)["subscriptions"].get(subscription, {}))


def trim_passes(server: ServerProcess) -> int:
    """Completed trim passes of the publishing forwarder since the server started."""
    return int(status(server)["trim_passes"])


def wait_trim_passes(server: ServerProcess, passes: int = 2, timeout: float = 30.0) -> None:
    """Return once ``passes`` more trim passes have completed than when called.

    A pass flushes the ack journals, then trims every source to what its subscriptions and
    pins still need. The first pass counted may have begun before the call, so ``passes=2``
    (the default) means at least one whole pass ran after it: everything acked or pinned
    before the call has been through a complete pass. (A pass does not wait for an ack journal
    flush the 50 ms flush loop began before it: a test that needs acks durable keeps the default
    interval, which gives such a flush 2 s.) The interval is the server's
    ``PUBSUBD_TRIM_INTERVAL_S`` (2 s by default); ``timeout`` leaves room for a loaded machine.
    """
    target = trim_passes(server) + passes
    wait_for(lambda: trim_passes(server) >= target, timeout, f"{passes} more trim passes")
