"""Property: a run of messages taken at once is what taking them one by one gives.

The planner takes a run of unacked, unleased messages of an entry without a filter, delay or
ordering key in one step (``DeliveryPlanner._take``); with a filter it goes message by
message. Two planners over the same topic, one with a filter every message passes, go
through the same random publishes, plans under message and byte caps, acks, nacks,
redeliveries and seeks to states with acked runs inside entries not yet read: every response
is the same messages at the same positions and lease generations, for framed and raw
consumers alike.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pubsubd.acks.cursor import Cursor
from tests.support.planner import MemoryTopic, Recorder, planner, run, subscription
from tests.unit.test_raw_delivery import RawRecorder

pytestmark = pytest.mark.property

_steps = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.lists(st.integers(1, 300), min_size=1, max_size=30)),
        st.tuples(st.just("plan"), st.integers(1, 40), st.sampled_from([0, 1, 200, 2000])),
        st.tuples(st.just("ack"), st.lists(st.booleans(), max_size=40)),
        st.tuples(st.just("nack"), st.lists(st.booleans(), max_size=40)),
        # a seek to a state with acked ranges ahead (as after a restart or a Seek)
        st.tuples(
            st.just("seek"),
            st.integers(0, 10),
            st.lists(st.tuples(st.integers(0, 40), st.integers(1, 5)), max_size=4),
        ),
    ),
    min_size=1,
    max_size=25,
)


def _seen(consumer: Any, p: Any) -> list[tuple[int, int, Any]]:
    if isinstance(consumer, RawRecorder):
        out = [(pos, gen, m.data) for pos, gen, _, m in consumer.received]
        consumer.received.clear()
        return out
    response = [(p.decode(a)[0], p.decode(a)[1], None) for a, _, _ in consumer.received]
    consumer.received.clear()
    return response


@settings(max_examples=400, deadline=None)
@given(_steps, st.booleans(), st.booleans())
@example([("publish", [1] * 10), ("seek", 0, [(3, 2)]), ("plan", 40, 0)], False, False)
@example([("publish", [1] * 10), ("seek", 2, [(3, 2)]), ("plan", 40, 200)], True, True)
def test_runs_taken_at_once_match_one_by_one(
    steps: list[tuple[Any, ...]], raw: bool, deduplicated: bool
) -> None:
    topic = MemoryTopic()
    bulk = planner(topic, subscription())
    single = planner(topic, subscription(filter="NOT attributes:never"))
    consumers = []
    for p in (bulk, single):
        c: Any = RawRecorder(max_messages=0) if raw else Recorder()
        p.add_consumer(c)
        consumers.append(c)
    held: list[tuple[int, int]] = []  # (position, generation) delivered, not settled
    now = 0.0
    for step in steps:
        if step[0] == "publish":
            data = [b"d" * n for n in step[1]]
            if deduplicated:
                topic.publish_deduplicated(*data)
            else:
                topic.publish(*data)
        elif step[0] == "plan":
            for c in consumers:
                c.max_messages, c.max_bytes = step[1], step[2]
            got = []
            for p, c in zip((bulk, single), consumers, strict=True):
                run(p, now)
                got.append(_seen(c, p))
            assert got[0] == got[1]
            held += [(pos, gen) for pos, gen, _ in got[0]]
        elif step[0] == "seek":
            mark, spans = step[1], step[2]
            acked = Cursor(mark)
            for start, length in spans:
                acked.ack_range(mark + start, mark + start + length)
            for p in (bulk, single):
                p.reset({0: acked.snapshot()})
            held = []
        else:
            chosen = [d for d, pick in zip(held, step[1], strict=False) if pick]
            held = [d for d in held if d not in chosen]
            for p in (bulk, single):
                if step[0] == "ack":
                    p.acknowledge([pos for pos, _ in chosen])
                else:
                    p.modify_deadline(chosen, 0, now)
        now += 1.0
    assert bulk.cursors[0].snapshot() == single.cursors[0].snapshot()
