"""Unit tests for pubsubd.spark.offsets and pubsubd.spark.options (pure; no Spark session)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

import itertools

from pubsubd.spark import offsets as off
from pubsubd.spark.options import OptionError, SourceOptions, parse_timestamp

pytestmark = pytest.mark.unit

T = "projects/p/topics/orders"
B = {0: off.SourceBounds(5, 100), 1: off.SourceBounds(0, 40)}


def test_parse_earliest_latest_and_empty() -> None:
    assert off.parse_spec("earliest", T, off.LATEST) == off.OffsetSpec(off.EARLIEST, {})
    assert off.parse_spec(" Latest ", T, off.EARLIEST) == off.OffsetSpec(off.LATEST, {})
    assert off.parse_spec(None, T, off.LATEST) == off.OffsetSpec(off.LATEST, {})


def test_parse_json_full_or_short_topic_key() -> None:
    spec = off.parse_spec('{"orders": {"0": 12, "1": -2}}', T, off.LATEST)
    assert spec.explicit == {0: 12, 1: off.EARLIEST}
    spec = off.parse_spec('{"projects/p/topics/orders": {"1": -1}}', T, off.EARLIEST)
    assert spec.explicit == {1: off.LATEST}


@pytest.mark.parametrize(
    "text",
    [
        "nonsense",
        "[1]",
        '{"other": {"0": 1}}',
        '{"orders": {"x": 1}}',
        '{"orders": {"0": -3}}',
        '{"orders": {"0": "5"}}',
        '{"orders": [1]}',
    ],
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(off.OffsetSpecError):
        off.parse_spec(text, T, off.LATEST)


def test_json_round_trip_is_kafka_form() -> None:
    obj = off.positions_to_json(T, {1: 40, 0: 12})
    assert obj == {T: {"0": 12, "1": 40}}
    assert list(obj[T]) == ["0", "1"]
    assert off.positions_from_json(obj, T) == {0: 12, 1: 40}


def test_resolve_sentinels_and_missing_partitions() -> None:
    spec = off.OffsetSpec(off.EARLIEST, {0: off.LATEST, 7: 3})
    assert off.resolve(spec, B) == {0: 100, 1: 0, 7: 3}
    assert off.resolve(off.OffsetSpec(off.LATEST, {1: 10}), B) == {0: 100, 1: 10}


def test_with_new_partitions_starts_at_earliest() -> None:
    assert off.with_new_partitions({0: 50}, B) == {0: 50, 1: 0}


def test_data_loss_and_skip() -> None:
    lost = off.find_data_loss({0: 2, 1: 41}, B)
    assert [(x.partition, x.wanted, x.earliest) for x in lost] == [(0, 2, 5), (1, 41, 0)]
    assert "no longer retained" in lost[0].describe(T)
    assert "beyond" in lost[1].describe(T)
    assert off.skip_lost({0: 2, 1: 41}, B) == {0: 5, 1: 0}
    assert off.find_data_loss({0: 5, 1: 40}, B) == []


def test_admit_unlimited_takes_everything() -> None:
    assert off.admit({0: 5, 1: 0}, {0: 100, 1: 40}) == {0: 100, 1: 40}


def test_admit_splits_rows_in_proportion() -> None:
    end = off.admit({0: 0, 1: 0}, {0: 300, 1: 100}, max_rows=100)
    assert end == {0: 75, 1: 25}


def test_admit_always_progresses() -> None:
    end = off.admit({0: 0, 1: 0, 2: 0}, {0: 1, 1: 1, 2: 1}, max_rows=1)
    assert sum(end.values()) == 1


def test_admit_no_data_returns_start() -> None:
    assert off.admit({0: 10, 1: 4}, {0: 10, 1: 4}, max_rows=5) == {0: 10, 1: 4}
    # the head never moves a position backwards
    assert off.admit({0: 10}, {0: 8}) == {0: 10}


def test_admit_bytes_budget_uses_average_size() -> None:
    end = off.admit({0: 0}, {0: 1000}, max_bytes=10_000, avg_bytes={0: 100.0})
    assert end == {0: 100}
    end = off.admit({0: 0}, {0: 1000}, max_rows=50, max_bytes=10_000, avg_bytes={0: 100.0})
    assert end == {0: 50}


def test_batches_of_300_over_1000_messages() -> None:
    start, head, sizes = {0: 0}, {0: 1000}, []
    while True:
        end = off.admit(start, head, max_rows=300)
        if end == start:
            break
        sizes.append(end[0] - start[0])
        start = end
    assert sizes == [300, 300, 300, 100]


def test_cap_at_available_now_target() -> None:
    assert off.cap({0: 50, 1: 10, 2: 4}, {0: 40, 1: 20}) == {0: 40, 1: 10, 2: 4}


def test_ranges_skip_empty() -> None:
    assert off.ranges({0: 5, 1: 40}, {0: 10, 1: 40, 2: 3}) == [off.OffsetRange(0, 5, 10)]


def test_split_min_partitions() -> None:
    parts = off.split([off.OffsetRange(0, 0, 90), off.OffsetRange(1, 0, 10)], min_partitions=10)
    assert len(parts) == 10
    assert sum(r.size for r in parts) == 100
    assert [r for r in parts if r.partition == 1] == [off.OffsetRange(1, 0, 10)]
    p0 = [r for r in parts if r.partition == 0]
    assert p0[0].start == 0 and p0[-1].end == 90
    assert all(a.end == b.start for a, b in itertools.pairwise(p0))


def test_split_max_per_partition_and_tiny_ranges() -> None:
    parts = off.split([off.OffsetRange(0, 0, 10)], max_per_partition=3)
    assert [r.size for r in parts] == [3, 3, 2, 2]
    assert off.split([off.OffsetRange(0, 0, 2)], min_partitions=8) == [
        off.OffsetRange(0, 0, 1),
        off.OffsetRange(0, 1, 2),
    ]


def test_options_case_insensitive_and_defaults() -> None:
    opts = SourceOptions.parse(
        {"ENDPOINT": "h:1", "topic": "orders", "Project": "p", "maxoffsetspertrigger": "10"}
    )
    assert opts.endpoint == "h:1"
    assert opts.topic == T
    assert opts.max_offsets_per_trigger == 10
    assert opts.fail_on_data_loss is True
    assert opts.fetch_size == 5000


def test_options_errors() -> None:
    with pytest.raises(OptionError):
        SourceOptions.parse({"endpoint": "h:1"})
    with pytest.raises(OptionError):
        SourceOptions.parse({"topic": T, "maxOffsetsPerTrigger": "0"})
    with pytest.raises(OptionError):
        SourceOptions.parse({"topic": T, "failOnDataLoss": "maybe"})


def test_timestamps_millis_or_iso() -> None:
    assert parse_timestamp("1700000000123", "t") == 1_700_000_000_123_000
    assert parse_timestamp("2023-11-14T22:13:20.123Z", "t") == 1_700_000_000_123_000
    assert parse_timestamp("2023-11-14T22:13:20.123", "t") == 1_700_000_000_123_000
    with pytest.raises(OptionError):
        parse_timestamp("yesterday", "t")


def test_split_recorded_in_the_end_offset_round_trips() -> None:
    assert off.split_from_json({T: {"0": 1}}) is None  # an offset from before the key
    recorded = {T: {"0": 1}, off.SPLIT_KEY: off.split_to_json(2, None)}
    assert off.split_from_json(recorded) == (2, None)
    assert off.positions_from_json(recorded, T) == {0: 1}  # still Kafka's form for the topic
    assert off.split_from_json({off.SPLIT_KEY: off.split_to_json(None, 500)}) == (None, 500)
    with pytest.raises(off.OffsetSpecError):
        off.split_from_json({off.SPLIT_KEY: {"minPartitions": -1}})


def test_a_replayed_batch_keeps_its_split_when_the_options_change() -> None:
    """A driver restarted with another minPartitions replays the last planned batch: its Spark
    partitions (and so the sink's dedup IDs) must be those of the first plan."""
    from pubsubd.spark.source import PubsubdStreamReader

    def reader(**options: str) -> PubsubdStreamReader:
        return PubsubdStreamReader(SourceOptions.parse({"endpoint": "h:1", "topic": T, **options}))

    start = {T: {"0": 0}}
    planned = {T: {"0": 300}, off.SPLIT_KEY: off.split_to_json(2, None)}
    restarted = reader(minPartitions="1")
    pieces = [(p.start, p.end) for p in restarted.partitions(start, planned)]
    assert pieces == [(0, 150), (150, 300)]
    # Offsets written before the split was recorded: the options decide, as before.
    assert [(p.start, p.end) for p in restarted.partitions(start, {T: {"0": 300}})] == [(0, 300)]
