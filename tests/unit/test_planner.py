"""The delivery planner's rules, driven directly: no process, no event loop, time passed in."""

from __future__ import annotations

import pytest

from pubsubd.core import pb
from pubsubd.core.damage_policy import DamagePolicy
from pubsubd.core.errors import DataLoss, FailedPrecondition
from pubsubd.core.records import DamagedRange
from pubsubd.data.subscribe.consumers import StreamConsumer
from tests.support.planner import MemoryTopic, Recorder, ack_ids, planner, run, subscription

pytestmark = pytest.mark.unit


def test_consumers_share_messages_round_robin_within_flow_control() -> None:
    topic = MemoryTopic()
    p = planner(topic)
    a, b = Recorder(max_messages=3), Recorder(max_messages=3)
    p.add_consumer(a)
    p.add_consumer(b)
    positions = topic.publish(*[b"m%d" % i for i in range(10)])
    run(p, 0.0)
    assert len(a.received) == 3 and len(b.received) == 3  # each up to its flow control
    assert sorted(a.positions() + b.positions()) == positions[:6]
    assert len(p.leases) == 6
    # Acks free room; the rest follows, nothing twice.
    p.acknowledge([pos for pos, _ in ack_ids(p, a)])
    run(p, 1.0)
    assert sorted(a.positions() + b.positions()) == positions[:9]
    assert p.effects().acks == {}  # the acks' effects were taken by run()


def test_acks_become_ranges_for_the_publishing_side_and_move_the_cursor() -> None:
    topic = MemoryTopic()
    p = planner(topic)
    c = Recorder()
    p.add_consumer(c)
    topic.publish(*[b"m"] * 5)
    run(p, 0.0)
    ids_ = ack_ids(p, c)
    p.acknowledge([ids_[0][0], ids_[1][0], ids_[3][0]])
    fx = p.effects()
    assert fx.acks == {0: [(0, 2), (3, 4)]}
    assert p.cursors[0].mark_delete == 2 and p.cursors[0].acked_ranges() == [(3, 4)]
    p.acknowledge([ids_[0][0]])  # again: nothing new to record
    assert p.effects().acks == {}


def test_an_expired_lease_is_redelivered_and_its_silent_consumer_stalls() -> None:
    topic = MemoryTopic()
    p = planner(topic)
    silent, live = Recorder(deadline_s=10), Recorder(deadline_s=10)
    p.add_consumer(silent)
    [pos] = topic.publish(b"x")
    run(p, 0.0)
    assert silent.positions() == [pos]
    p.add_consumer(live)
    assert p.next_wakeup() == 10.0
    assert not p.tick(9.9)
    assert p.tick(10.0)  # expired, never confirmed: the consumer did not get it
    assert silent.stalled
    run(p, 10.0)
    assert live.positions() == [pos]
    assert p.leases.attempts(pos) == 2


def test_a_confirmed_lease_that_expires_does_not_stall_its_consumer() -> None:
    topic = MemoryTopic()
    p = planner(topic)
    c = Recorder(deadline_s=10)
    p.add_consumer(c)
    topic.publish(b"x")
    run(p, 0.0)
    p.modify_deadline(ack_ids(p, c), 20, 1.0)  # a receipt: the client has it
    assert p.next_wakeup() == 21.0
    assert p.tick(21.0)
    assert not c.stalled
    run(p, 21.0)
    assert len(c.received) == 2


def test_nack_waits_out_the_retry_policy_backoff() -> None:
    topic = MemoryTopic()
    policy = pb.Subscription().retry_policy.__class__()
    policy.minimum_backoff.seconds = 5
    p = planner(topic, subscription(retry_policy=policy))
    c = Recorder()
    p.add_consumer(c)
    [pos] = topic.publish(b"x")
    run(p, 0.0)
    p.modify_deadline(ack_ids(p, c), 0, 1.0)  # nack
    run(p, 1.0)
    assert c.positions() == [pos]  # not yet: backoff
    assert p.next_wakeup() == 6.0
    assert p.tick(6.0)
    run(p, 6.0)
    assert c.positions() == [pos, pos]


def test_the_last_allowed_failure_becomes_a_dead_letter() -> None:
    topic = MemoryTopic()
    dlq = pb.Subscription().dead_letter_policy.__class__(
        dead_letter_topic="projects/p/topics/dlq", max_delivery_attempts=5
    )
    p = planner(topic, subscription(dead_letter_policy=dlq))
    c = Recorder()
    p.add_consumer(c)
    [pos] = topic.publish(b"x")
    for attempt in range(1, 6):
        run(p, float(attempt))
        assert c.received[-1][2] == attempt  # delivery_attempt
        p.modify_deadline([ack_ids(p, c)[-1]], 0, float(attempt))
    fx = p.effects()
    assert fx.dead_letters == [(pos, 5)]
    run(p, 10.0)
    assert len(c.received) == 5  # not delivered while it is being dead-lettered
    p.dead_letter_done(pos)
    assert p.effects().acks == {0: [(0, 1)]}
    assert p.dead_lettered == 1


def test_give_back_redelivers_at_once_without_counting_an_attempt() -> None:
    topic = MemoryTopic()
    p = planner(topic)
    gone, live = Recorder(), Recorder()
    p.add_consumer(gone)
    [pos] = topic.publish(b"x")
    run(p, 0.0)
    p.remove_consumer(gone)
    assert p.give_back(gone.id, [pos]) == 1
    p.add_consumer(live)
    run(p, 0.0)
    assert live.positions() == [pos]
    assert p.leases.attempts(pos) == 1


def test_a_frontend_gives_back_deliveries_by_ack_id_only_while_they_are_current() -> None:
    topic = MemoryTopic()
    p = planner(topic)
    gone, live = Recorder(), Recorder()
    p.add_consumer(gone)
    first, second, third = topic.publish(b"x", b"y", b"z")
    run(p, 0.0)
    delivered = ack_ids(p, gone)
    p.remove_consumer(gone)
    p.modify_deadline([delivered[2]], 30, 0.5)  # the client acted on it: it did arrive
    stale = (delivered[1][0], delivered[1][1] + 99)  # not this delivery's generation
    assert p.give_back_deliveries([delivered[0], stale, delivered[2]]) == 1
    p.add_consumer(live)
    run(p, 1.0)
    assert live.positions() == [first]
    assert p.leases.attempts(first) == 1  # no attempt counted for the one that came back
    assert second not in live.positions() and third not in live.positions()


def test_one_outstanding_batch_per_ordering_key_and_nack_requeues_the_rest_in_order() -> None:
    topic = MemoryTopic()
    p = planner(topic, subscription(enable_message_ordering=True))
    a, b = Recorder(max_messages=2), Recorder(max_messages=2)
    p.add_consumer(a)
    p.add_consumer(b)
    first = topic.publish(b"k1", b"k2", key="k")
    later = topic.publish(b"k3", key="k")
    other = topic.publish(b"o1", key="o")
    run(p, 0.0)
    assert a.positions() == first  # one batch of key k
    assert b.positions() == other  # k3 waits until k1 and k2 are acked
    p.modify_deadline([ack_ids(p, a)[0]], 0, 1.0)  # nack k1: k1 and k2 go back, in order
    run(p, 1.0)
    assert a.positions()[2:] + b.positions()[1:] == first
    assert later[0] not in a.positions() + b.positions()
    holder = a if len(a.received) == 4 else b
    p.acknowledge([pos for pos, _ in ack_ids(p, holder)[-2:]])
    run(p, 2.0)
    assert later[0] in a.positions() + b.positions()  # the key's next batch


def test_an_ack_of_a_later_message_after_its_keys_nack_waits_for_the_redelivery() -> None:
    # The official Node client hands a key's whole batch to the application at once, so an ack
    # of k3 can come after the nack of k2 with k3's old ack ID: the key must still be
    # redelivered from k2 on, k3 included (README: "redelivers that message and every later
    # one of the key, in order").
    topic = MemoryTopic()
    p = planner(topic, subscription(enable_message_ordering=True))
    c = Recorder()
    p.add_consumer(c)
    k1, k2, k3 = topic.publish(b"k1", b"k2", b"k3", key="k")
    run(p, 0.0)
    assert c.positions() == [k1, k2, k3]
    first = ack_ids(p, c)
    p.modify_deadline([first[1]], 0, 1.0)  # nack k2
    p.acknowledge([k1, k3])  # k3's ack names the delivery the nack ended
    fx = run(p, 1.0)
    assert fx.acks == {0: [(0, 1)]}  # only k1
    assert c.positions()[3:] == [k2, k3]
    p.acknowledge([pos for pos, _ in ack_ids(p, c)[3:]])
    assert p.effects().acks == {0: [(1, 3)]}
    assert p.cursors[0].mark_delete == 3


def test_an_evicted_message_awaiting_redelivery_is_acked() -> None:
    topic = MemoryTopic()
    p = planner(topic, subscription(enable_message_ordering=True))
    c = Recorder()
    p.add_consumer(c)
    k1, k2 = topic.publish(b"k1", b"k2", key="k")
    run(p, 0.0)
    p.modify_deadline([ack_ids(p, c)[0]], 0, 1.0)  # nack k1: k2 awaits its redelivery
    p.evict([k1, k2])
    assert p.effects().acks == {0: [(0, 2)]}


def test_filtered_out_messages_are_acked_without_delivery() -> None:
    topic = MemoryTopic()
    p = planner(topic, subscription(filter='attributes.kind = "keep"'))
    c = Recorder()
    p.add_consumer(c)
    keep = topic.publish(b"a", attributes={"kind": "keep"})
    topic.publish(b"b", attributes={"kind": "drop"})
    fx = run(p, 0.0)
    assert c.positions() == keep
    assert fx.acks == {0: [(1, 2)]}


def test_failover_serves_the_first_stream_by_client_id_and_exclusive_refuses_a_second() -> None:
    topic = MemoryTopic()
    labels = {"pubsubd-subscription-type": "failover"}
    p = planner(topic, subscription(labels=labels))
    b_stream = StreamConsumer(10, 0, 0, "client-b")
    a_stream = StreamConsumer(10, 0, 0, "client-a")
    p.add_consumer(b_stream)
    p.add_consumer(a_stream)
    topic.publish(b"x", b"y")
    p.plan(0.0)
    fx = p.effects()
    assert [d.consumer for d in fx.deliveries] == [a_stream]
    exclusive = planner(topic, subscription(labels={"pubsubd-subscription-type": "exclusive"}))
    exclusive.add_consumer(StreamConsumer(10, 0, 0, "one"))
    exclusive.admit("one")  # the same client reconnecting
    with pytest.raises(FailedPrecondition, match="exclusive"):
        exclusive.admit("two")
    with pytest.raises(FailedPrecondition, match="Pull is refused"):
        exclusive.admit_pull()


def test_subscription_caps_pause_delivery() -> None:
    topic = MemoryTopic()
    p = planner(topic, subscription(labels={"pubsubd-max-outstanding-messages": "2"}))
    a, b = Recorder(), Recorder()
    p.add_consumer(a)
    p.add_consumer(b)
    topic.publish(*[b"m"] * 5)
    run(p, 0.0)
    assert len(a.received) + len(b.received) == 2


def _damaged(first: int, end: int) -> DamagedRange:
    return DamagedRange("seg", first, end, 0, 10, "CRC mismatch", "read", True)


def test_damage_stops_the_source_and_tells_an_idle_consumer() -> None:
    topic = MemoryTopic()
    p = planner(topic)
    c = Recorder()
    p.add_consumer(c)
    before = topic.publish(b"a")
    topic.publish(b"b", b"c")  # damaged
    topic.publish(b"d")
    topic.damaged[0] = [_damaged(1, 3)]
    run(p, 0.0)
    assert c.positions() == before
    p.acknowledge(before)
    fx = run(p, 0.0)
    [(ended, error)] = fx.ended
    assert ended is c and isinstance(error, DataLoss) and "skip-damaged" in str(error)
    assert p.damage_status([(0, _damaged(1, 3))]) == [
        {"source": 0, "first_offset": 1, "end_offset": 3, "unacked": 2}
    ]
    # The operator skips it: acked as lost, delivery goes on.
    assert p.skip_damaged([(0, _damaged(1, 3))]) == 2
    assert p.effects().lost == [1, 2]
    other = Recorder()
    p.add_consumer(other)
    run(p, 0.0)
    assert other.positions() == [3]


def test_skip_policy_acks_damaged_messages_as_lost() -> None:
    topic = MemoryTopic(policy=DamagePolicy.SKIP)
    p = planner(topic)
    c = Recorder()
    p.add_consumer(c)
    topic.publish(b"a")
    topic.publish(b"b")
    topic.publish(b"c")
    topic.damaged[0] = [_damaged(1, 2)]
    fx = run(p, 0.0)
    assert c.positions() == [0, 2]
    assert fx.lost == [1] and p.lost == 1
    assert fx.acks == {0: [(1, 2)]}


@pytest.mark.parametrize("policy", [DamagePolicy.STOP, DamagePolicy.SKIP])
def test_damage_being_restored_is_waited_for_whatever_the_policy(policy: DamagePolicy) -> None:
    """A cluster's local copy re-reads damage from the storage nodes: nothing is lost, so the
    planner neither skips it nor ends the consumer; once restored, delivery goes on; if the
    restore fails, the policy applies."""
    topic = MemoryTopic(policy=policy, restoring=True)
    p = planner(topic)
    c = Recorder()
    p.add_consumer(c)
    first = topic.publish(b"a")
    topic.publish(b"b")  # damaged, being restored
    topic.publish(b"c")
    topic.damaged[0] = [_damaged(1, 2)]
    fx = run(p, 0.0)
    assert c.positions() == first and not fx.ended and not fx.lost and p.lost == 0
    p.acknowledge(first)
    fx = run(p, 0.0)
    assert not fx.ended and not fx.lost  # waits at the damage
    topic.restoring = False
    fx = run(p, 0.0)
    if policy is DamagePolicy.SKIP:
        assert fx.lost == [1] and c.positions()[-1] == 2
    else:
        [(ended, error)] = fx.ended
        assert ended is c and isinstance(error, DataLoss)


def test_a_redelivery_found_damaged_while_restoring_is_delivered_once_restored() -> None:
    topic = MemoryTopic(policy=DamagePolicy.SKIP)
    p = planner(topic)
    c = Recorder()
    p.add_consumer(c)
    topic.publish(b"a", b"b")
    run(p, 0.0)
    assert c.positions() == [0, 1]
    topic.damaged[0] = [_damaged(0, 2)]  # found damaged when read again
    topic.restoring = True
    p.modify_deadline(ack_ids(p, c), 0, 1.0)  # nack
    fx = run(p, 1.0)
    assert not fx.lost and c.positions() == [0, 1]  # waits, not acked as lost
    topic.damaged[0] = []
    topic.restoring = False
    run(p, 2.0)
    assert c.positions() == [0, 1, 0, 1]  # restored: redelivered


def test_reset_forgets_leases_and_old_ack_ids_stop_working() -> None:
    topic = MemoryTopic()
    p = planner(topic)
    c = Recorder()
    p.add_consumer(c)
    topic.publish(b"a", b"b")
    run(p, 0.0)
    old = ack_ids(p, c)
    from pubsubd.core.records import CursorState

    p.reset({0: CursorState(0)})
    assert len(p.leases) == 0 and c.outstanding == 0
    assert all(generation < p.generation_floor for _, generation in old)
    run(p, 0.0)
    assert len(c.received) == 4  # both again


def test_a_consumer_of_some_sources_gets_only_their_messages_new_and_redelivered() -> None:
    topic = MemoryTopic(sources=[[], [], []])
    p = planner(topic)
    only_1 = Recorder()
    only_1.sources = frozenset({1})
    p.add_consumer(only_1)
    in_0 = topic.publish(b"a", b"b", source=0)
    in_1 = topic.publish(b"c", b"d", source=1)
    topic.publish(b"e", source=2)
    run(p, 0.0)
    assert only_1.positions() == in_1  # sources 0 and 2 wait for a consumer of theirs
    rest = Recorder()
    rest.sources = frozenset({0, 2})
    p.add_consumer(rest)
    run(p, 1.0)
    assert sorted(rest.positions())[:2] == in_0 and len(rest.positions()) == 3
    # A nacked message of source 1 goes back to source 1's consumer only.
    first = ack_ids(p, only_1)[0]
    p.modify_deadline([first], 0, 2.0)
    run(p, 2.0)
    assert only_1.positions() == [*in_1, in_1[0]]
    assert len(rest.positions()) == 3


def test_a_spread_subscription_s_planner_restricts_every_consumer_to_its_sources() -> None:
    """A subscribing forwarder serving sources 0 and 2 of a spread subscription: a consumer
    with no sources of its own, and one asking for 1 and 2, get only what is served here;
    source 1 is never read (its owner elsewhere delivers it)."""
    topic = MemoryTopic(sources=[[], [], []])
    p = planner(topic)
    p.served_sources = frozenset({0, 2})
    anything, asked = Recorder(), Recorder()
    asked.sources = frozenset({1, 2})
    p.add_consumer(anything)
    p.add_consumer(asked)
    assert anything.sources == {0, 2} and asked.sources == {2}
    served = [*topic.publish(b"a", source=0), *topic.publish(b"b", b"c", source=2)]
    topic.publish(b"elsewhere", source=1)
    run(p, 0.0)
    assert sorted(anything.positions() + asked.positions()) == sorted(served)
    assert 1 not in p.read_offsets  # never read here


def test_key_shared_and_failover_treat_streams_of_one_client_id_as_one_client() -> None:
    topic = MemoryTopic(sources=[[], []])
    p = planner(topic, subscription(labels={"pubsubd-subscription-type": "failover"}))
    # One client's consumers of partitions 0 and 1 (the Pulsar front), and a standby client.
    part0, part1 = StreamConsumer(10, 0, 0, "client-a"), StreamConsumer(10, 0, 0, "client-a")
    part0.sources, part1.sources = frozenset({0}), frozenset({1})
    standby = StreamConsumer(10, 0, 0, "client-b")
    for c in (standby, part0, part1):
        p.add_consumer(c)
    topic.publish(b"x", source=0)
    topic.publish(b"y", source=1)
    p.plan(0.0)
    got = {d.consumer.id: d.positions for d in p.effects().deliveries}
    assert set(got) == {part0.id, part1.id}
    ks = planner(topic, subscription(labels={"pubsubd-subscription-type": "key_shared"}))
    k0, k1 = StreamConsumer(10, 0, 0, "client-a"), StreamConsumer(10, 0, 0, "client-a")
    k0.sources, k1.sources = frozenset({0}), frozenset({1})
    ks.add_consumer(k0)
    ks.add_consumer(k1)
    key0 = topic.publish(b"k", key="same", source=0)
    key1 = topic.publish(b"k", key="other", source=1)
    ks.plan(0.0)
    by_consumer: dict[int, list[int]] = {}
    for d in ks.effects().deliveries:
        by_consumer.setdefault(d.consumer.id, []).extend(d.positions)
    # Each key is the one client's, and each message goes to the stream of its source.
    assert set(key0) <= set(by_consumer.get(k0.id, []))
    assert set(key1) <= set(by_consumer.get(k1.id, []))


def test_failover_shares_sources_out_when_every_stream_reads_one() -> None:
    """Pulsar's failover rule for partitions: of the clients reading source N, sorted by
    client_id, the one at N mod their count is active; when it leaves, the next one takes over.
    """
    topic = MemoryTopic(sources=[[], [], []])
    p = planner(topic, subscription(labels={"pubsubd-subscription-type": "failover"}))
    streams = {}
    for client in ("b", "a"):
        for source in range(3):
            stream = StreamConsumer(10, 0, 0, client)
            stream.sources = frozenset({source})
            streams[client, source] = stream
            p.add_consumer(stream)
    for source in range(3):
        topic.publish(b"m", source=source)
    p.plan(0.0)
    got = {(d.consumer.client_id, next(iter(d.consumer.sources))) for d in p.effects().deliveries}
    assert got == {("a", 0), ("b", 1), ("a", 2)}  # sorted [a, b]: 0 -> a, 1 -> b, 2 -> a
    p.remove_consumer(streams["b", 1])
    topic.publish(b"n", source=1)
    p.plan(0.0)
    got = {(d.consumer.client_id, next(iter(d.consumer.sources))) for d in p.effects().deliveries}
    assert got == {("a", 1)}


def test_failover_streams_that_ask_are_told_each_change_of_their_receiver_state() -> None:
    """``active_changes``: only streams with ``active_notices``, only on a change, each once;
    a stream that did not ask (a Google client's) is never told."""
    p = planner(MemoryTopic(), subscription(labels={"pubsubd-subscription-type": "failover"}))
    b = StreamConsumer(10, 0, 0, "b")
    b.active_notices = True
    p.add_consumer(b)
    assert p.active_changes() == [(b, True)]
    assert p.active_changes() == []  # told once
    a = StreamConsumer(10, 0, 0, "a")
    a.active_notices = True
    silent = StreamConsumer(10, 0, 0, "c")  # never asked
    p.add_consumer(a)
    p.add_consumer(silent)
    assert sorted(p.active_changes(), key=lambda c: c[0].client_id) == [(a, True), (b, False)]
    p.remove_consumer(a)
    assert p.active_changes() == [(b, True)]
    shared = planner(MemoryTopic(), subscription())
    s = StreamConsumer(10, 0, 0, "s")
    s.active_notices = True
    shared.add_consumer(s)
    assert shared.active_changes() == []  # Shared: no notices (Pulsar sends them for failover)
