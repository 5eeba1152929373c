"""Producer access modes of a Pulsar topic (pulsar/access.py): Pulsar's rules, step by step."""

from __future__ import annotations

from pubsubd.pulsar.access import AccessMode, Granted, Queued, Refused, TopicAccess

SHARED = AccessMode.SHARED
EXCLUSIVE = AccessMode.EXCLUSIVE
WAIT = AccessMode.WAIT_FOR_EXCLUSIVE
FENCING = AccessMode.EXCLUSIVE_WITH_FENCING


def test_shared_producers_share_and_keep_an_exclusive_one_out() -> None:
    topic: TopicAccess[str] = TopicAccess()
    assert topic.request("a", "a", SHARED, None) == Granted(None)
    assert topic.request("b", "b", SHARED, None) == Granted(None)
    refused = topic.request("x", "x", EXCLUSIVE, None)
    assert refused == Refused("ProducerFenced", "Topic has existing shared producers")
    topic.release("a")
    topic.release("b")
    assert topic.idle
    assert topic.request("x", "x", EXCLUSIVE, None) == Granted(0)


def test_an_exclusive_producer_refuses_others_until_it_leaves() -> None:
    topic: TopicAccess[str] = TopicAccess()
    assert topic.request("x", "first", EXCLUSIVE, None) == Granted(0)
    assert topic.request("y", "second", EXCLUSIVE, None) == Refused(
        "ProducerFenced", "Topic has an existing exclusive producer: first"
    )
    assert topic.request("s", "shared", SHARED, None) == Refused(
        "ProducerBusy", "Topic has an existing exclusive producer: first"
    )
    assert topic.request("x", "first", EXCLUSIVE, None) == Granted(0)  # a repeat
    released = topic.release("x")
    assert released.promoted is None and released.refused == ()
    assert topic.request("y", "second", EXCLUSIVE, None) == Granted(1)  # the epoch moves on


def test_wait_for_exclusive_queues_and_takes_over_in_order() -> None:
    topic: TopicAccess[str] = TopicAccess()
    assert topic.request("x", "x", EXCLUSIVE, None) == Granted(0)
    assert topic.request("w1", "w1", WAIT, None) == Queued()
    assert topic.request("w2", "w2", WAIT, None) == Queued()
    # Queued ones keep everyone else out, as a holder does.
    assert isinstance(topic.request("s", "s", SHARED, None), Refused)
    assert isinstance(topic.request("e", "e", EXCLUSIVE, None), Refused)
    released = topic.release("x")
    assert released.promoted is not None and released.promoted.key == "w1"
    assert released.promoted.epoch == 1
    assert topic.holder == "w1"
    released = topic.release("w2")  # gave up waiting: nothing changes for the holder
    assert released.promoted is None and topic.holder == "w1"
    assert topic.release("w1").promoted is None
    assert topic.idle


def test_wait_for_exclusive_behind_shared_producers_gets_the_topic_when_they_leave() -> None:
    topic: TopicAccess[str] = TopicAccess()
    topic.request("a", "a", SHARED, None)
    topic.request("b", "b", SHARED, None)
    assert topic.request("w", "w", WAIT, None) == Queued()
    assert topic.release("a").promoted is None
    released = topic.release("b")
    assert released.promoted is not None and released.promoted.key == "w"
    assert released.promoted.epoch == 0


def test_fencing_closes_the_producers_and_refuses_the_queued_ones() -> None:
    topic: TopicAccess[str] = TopicAccess()
    topic.request("x", "x", EXCLUSIVE, None)
    topic.request("w", "w", WAIT, None)
    granted = topic.request("f", "f", FENCING, None)
    assert granted == Granted(1, fenced=("x",), refused=("w",))
    assert topic.holder == "f" and list(topic.producers) == ["f"]
    # The fenced producer reconnects with the epoch it was given: refused for good.
    assert topic.request("x", "x", EXCLUSIVE, 0) == Refused(
        "ProducerFenced", "Topic has an existing exclusive producer: f"
    )
    topic.release("f")
    assert topic.request("x", "x", EXCLUSIVE, 0) == Refused(
        "ProducerFenced", "Topic epoch has already moved. Current epoch: 1, Producer epoch: 0"
    )
    # Fencing shared producers too; a reconnecting holder keeps its epoch.
    topic.request("a", "a", SHARED, None)
    assert topic.request("g", "g", FENCING, None) == Granted(2, fenced=("a",))
    topic.release("g")
    assert topic.request("g", "g", EXCLUSIVE, 2) == Granted(2)


def test_a_queued_producer_whose_epoch_was_passed_is_refused_and_the_next_promoted() -> None:
    topic: TopicAccess[str] = TopicAccess()
    topic.request("x", "x", EXCLUSIVE, None)  # epoch 0
    topic.release("x")
    topic.request("y", "y", EXCLUSIVE, None)  # epoch 1
    assert topic.request("old", "old", WAIT, 0) == Queued()
    assert topic.request("new", "new", WAIT, None) == Queued()
    released = topic.release("y")
    assert released.refused == ("old",)
    assert released.promoted is not None and released.promoted.key == "new"
    assert released.promoted.epoch == 2
