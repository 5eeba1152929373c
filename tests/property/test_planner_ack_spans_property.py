"""Property: acks given with their runs (``spans``, a Pulsar batch's (first, count)) change the
planner as the same acks given one position at a time.

Two planners over the same topic go through the same random publishes, plans, nacks and acks
of chosen delivered positions; one is told each ack's runs of consecutive positions (in any
order, some overlapping), the other only the positions. Their cursors, the ranges they report
for the ack journal (as sets of offsets) and their later deliveries stay the same.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.planner import MemoryTopic, Recorder, planner, run, subscription

pytestmark = pytest.mark.property

_steps = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 30)),
        st.tuples(st.just("plan"), st.integers(1, 40)),
        st.tuples(st.just("ack"), st.lists(st.booleans(), max_size=40), st.booleans()),
        st.tuples(st.just("nack"), st.lists(st.booleans(), max_size=40)),
    ),
    min_size=1,
    max_size=25,
)


def _spans(positions: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive positions, as a Pulsar consumer's batches name them."""
    out: list[tuple[int, int]] = []
    for pos in sorted(positions):
        if out and out[-1][0] + out[-1][1] == pos:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((pos, 1))
    return out


def _offsets(acks: dict[int, list[tuple[int, int]]]) -> set[tuple[int, int]]:
    return {(s, o) for s, ranges in acks.items() for a, b in ranges for o in range(a, b)}


@settings(max_examples=300, deadline=None)
@given(_steps)
def test_acks_with_spans_change_the_planner_as_positions_do(steps: list[tuple[Any, ...]]) -> None:
    topic = MemoryTopic()
    by_spans = planner(topic, subscription())
    by_positions = planner(topic, subscription())
    consumers = []
    for p in (by_spans, by_positions):
        c = Recorder()
        p.add_consumer(c)
        consumers.append(c)
    held: list[tuple[int, int]] = []
    now = 0.0
    for step in steps:
        if step[0] == "publish":
            topic.publish(*[b"d"] * step[1])
        elif step[0] == "plan":
            got = []
            for p, c in zip((by_spans, by_positions), consumers, strict=True):
                c.max_messages = step[1]
                run(p, now)
                got.append([p.decode(a) for a, _, _ in c.received])
                c.received.clear()
            assert got[0] == got[1]
            held += got[0]
        else:
            chosen = [d for d, pick in zip(held, step[1], strict=False) if pick]
            held = [d for d in held if d not in chosen]
            if step[0] == "nack":
                for p in (by_spans, by_positions):
                    p.modify_deadline(chosen, 0, now)
            else:
                positions = [pos for pos, _ in chosen]
                spans = _spans(positions)
                if step[2] and spans:  # out of order, one span named twice
                    spans = [*spans[::-1], spans[0]]
                by_spans.acknowledge(positions, spans)
                by_positions.acknowledge(positions)
                assert _offsets(by_spans.effects().acks) == _offsets(by_positions.effects().acks)
        now += 1.0
    assert by_spans.cursors[0].snapshot() == by_positions.cursors[0].snapshot()
    assert by_spans.acked == by_positions.acked
    assert len(by_spans.leases) == len(by_positions.leases)
