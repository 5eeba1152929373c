"""Server settings (config.py): defaults, environment overrides, validation at load time, and
the loop intervals reaching the publishing forwarder."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pubsubd.config import ServerConfig, from_env
from pubsubd.data.publish import forwarder as forwarder_module
from pubsubd.data.publish.forwarder import PublishingForwarder
from pubsubd.storage.log import FsyncPolicy

pytestmark = pytest.mark.unit


def test_interval_defaults_are_unchanged_and_match_the_forwarder() -> None:
    cfg = from_env({})
    assert cfg == ServerConfig()
    assert cfg.storage.trim_interval_s == 2.0 == forwarder_module.DEFAULT_TRIM_INTERVAL_S
    assert cfg.storage.ack_flush_interval_s == 0.05
    assert cfg.storage.ack_flush_interval_s == forwarder_module.DEFAULT_ACK_FLUSH_INTERVAL_S
    assert cfg.quota_check_s == 1.0
    assert cfg.expiry_check_s == 60.0
    assert cfg.sli_events_s == 10.0
    assert (cfg.slo_sample_s, cfg.test_slo_window_divisor) == (15.0, 1.0)


def test_intervals_from_the_environment() -> None:
    cfg = from_env(
        {
            "PUBSUBD_TRIM_INTERVAL_S": "0.25",
            "PUBSUBD_ACK_FLUSH_INTERVAL_S": "0.01",
            "PUBSUBD_QUOTA_CHECK_S": "0.5",
            "PUBSUBD_EXPIRY_CHECK_S": "3",
            "PUBSUBD_SLI_EVENTS_S": "0",
            "PUBSUBD_SEGMENT_BYTES": "4096",
            "PUBSUBD_SLO_SAMPLE_S": "0.2",
            "PUBSUBD_TEST_SLO_WINDOW_DIVISOR": "300",
        }
    )
    assert cfg.storage.trim_interval_s == 0.25
    assert cfg.storage.ack_flush_interval_s == 0.01
    assert cfg.quota_check_s == 0.5
    assert cfg.expiry_check_s == 3.0
    assert cfg.sli_events_s == 0.0
    assert cfg.storage.segment_bytes == 4096  # the other storage settings are kept
    assert (cfg.slo_sample_s, cfg.test_slo_window_divisor) == (0.2, 300.0)


@pytest.mark.parametrize(
    "name",
    [
        "PUBSUBD_TRIM_INTERVAL_S",
        "PUBSUBD_ACK_FLUSH_INTERVAL_S",
        "PUBSUBD_QUOTA_CHECK_S",
        "PUBSUBD_SLO_SAMPLE_S",
        "PUBSUBD_TEST_SLO_WINDOW_DIVISOR",
    ],
)
@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_an_interval_must_be_positive(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        from_env({name: value})


async def test_forwarder_loops_run_at_the_configured_intervals_and_count_trim_passes(
    tmp_path: Path,
) -> None:
    forwarder = PublishingForwarder(
        tmp_path, fsync=FsyncPolicy.NEVER, trim_interval_s=0.01, ack_flush_interval_s=0.01
    )
    assert (forwarder.trim_interval_s, forwarder.ack_flush_interval_s) == (0.01, 0.01)
    assert forwarder.trim_passes == 0
    forwarder.start()
    try:
        await forwarder.publish("topic", b"x", 1)  # a stored topic: the pass visits it
        await _passes(forwarder, 3)
    finally:
        await forwarder.close()
    passes = forwarder.trim_passes
    await asyncio.sleep(0.05)  # closed: no pass may run any more (a negative check)
    assert forwarder.trim_passes == passes


async def _passes(forwarder: PublishingForwarder, count: int) -> None:
    for _ in range(2000):  # 10 s at most
        if forwarder.trim_passes >= count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{forwarder.trim_passes} trim passes, not {count}")


def test_pulsar_port_defaults_to_6650_and_follows_the_environment() -> None:
    assert from_env({}).pulsar_port == 6650
    assert from_env({"PUBSUBD_PULSAR_PORT": "-1"}).pulsar_port == -1
    assert from_env({"PUBSUBD_PULSAR_PORT": "0"}).pulsar_port == 0


def test_ledger_size_and_copy_catch_up_from_the_environment() -> None:
    base = from_env({"PUBSUBD_CLUSTER": "127.0.0.1:2181"}).cluster
    assert base is not None
    assert (base.ledger_bytes, base.copy_fill_rate_bytes, base.copy_fill_min_messages) == (
        64 << 20,
        32 << 20,
        1024,
    )
    cluster = from_env(
        {
            "PUBSUBD_CLUSTER": "127.0.0.1:2181",
            "PUBSUBD_LEDGER_BYTES": "65536",
            "PUBSUBD_COPY_FILL_RATE_BYTES": "1000000",
            "PUBSUBD_COPY_FILL_MIN_MESSAGES": "1",
        }
    ).cluster
    assert cluster is not None
    assert (cluster.ledger_bytes, cluster.copy_fill_rate_bytes, cluster.copy_fill_min_messages) == (
        65536,
        1000000,
        1,
    )
    with pytest.raises(ValueError, match="PUBSUBD_LEDGER_BYTES"):
        from_env({"PUBSUBD_CLUSTER": "127.0.0.1:2181", "PUBSUBD_LEDGER_BYTES": "0"})
