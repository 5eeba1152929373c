"""Block_publishers backlog quotas evaluated at the topic's owner (data/publish/
owner_quotas.py, over fake logs): every subscription's whole backlog counts, from its journal's
cursors over every source, against its own quota or else its topic's; evict_oldest ones are
left to the dispatchers; blocks follow acks, deletes and a topic's move, and are kept apart
from the dispatchers' (``owner:`` keys)."""

from __future__ import annotations

import pytest

from pubsubd.acks.cursor import Cursor
from pubsubd.core import quotas
from pubsubd.core.records import SourceRange
from pubsubd.data.publish.owner_quotas import OWNER_BLOCK_PREFIX, OwnerQuotas

pytestmark = pytest.mark.unit

NOW_US = 1_000_000_000


class Logs:
    """Two sources; each message 10 bytes, published at second ``offset``."""

    def __init__(self) -> None:
        self.ends = [0, 0]

    def ranges(self, topic_uid: str) -> list[SourceRange]:
        return [SourceRange(0, end, end) for end in self.ends]

    def stored_bytes(self, topic_uid: str, source: int, start: int, stop: int) -> float:
        return 10.0 * (stop - start)

    def publish_time_us(self, topic_uid: str, source: int, offset: int) -> int:
        return offset * 1_000_000


def _owner() -> tuple[OwnerQuotas, Logs, dict[str, dict[int, Cursor]], dict]:  # type: ignore[type-arg]
    logs = Logs()
    journals: dict[str, dict[int, Cursor]] = {"a": {0: Cursor(0), 1: Cursor(0)}}
    blocks: dict[tuple[str, str], tuple[str, int]] = {}

    def set_block(topic: str, key: str, reason: str | None, from_us: int) -> None:
        if reason is None:
            blocks.pop((topic, key), None)
        else:
            blocks[(topic, key)] = (reason, from_us)

    owner = OwnerQuotas(logs, lambda t: journals if t == "t" else {}, set_block, lambda: NOW_US)
    return owner, logs, journals, blocks


def test_the_whole_backlog_over_every_source_blocks_and_acks_on_any_source_unblock() -> None:
    owner, logs, journals, blocks = _owner()
    owner.set_topic_quota("t", quotas.BacklogQuota(messages=4))
    owner.set_subscription("t", "a", "projects/p/subscriptions/a", None, has_own=False)
    logs.ends = [2, 1]
    owner.evaluate("t")
    assert not blocks  # 3 of 4
    logs.ends = [2, 2]
    owner.evaluate("t")
    reason, from_us = blocks[("t", OWNER_BLOCK_PREFIX + "a")]
    assert "projects/p/subscriptions/a has 4 unacked messages" in reason and from_us == 0
    journals["a"][1].ack_range(0, 1)  # one ack on the other source
    owner.evaluate("t", "a")
    assert not blocks
    owner.evaluate("elsewhere")  # a topic without a quota: nothing
    assert not blocks


def test_a_subscription_s_own_quota_comes_first_and_evict_policies_block_nothing() -> None:
    owner, logs, _journals, blocks = _owner()
    logs.ends = [5, 5]
    owner.set_topic_quota("t", quotas.BacklogQuota(messages=4))
    owner.set_subscription("t", "a", "a", None, has_own=False)
    assert blocks
    owner.set_subscription("t", "a", "a", quotas.BacklogQuota(messages=20), has_own=True)
    assert not blocks  # its own quota: 10 of 20
    owner.set_topic_quota("t", None)
    owner.set_subscription("t", "a", "a", quotas.BacklogQuota(messages=8), has_own=True)
    assert "quota 8" in blocks[("t", OWNER_BLOCK_PREFIX + "a")][0]
    evict = quotas.BacklogQuota(messages=4, policy=quotas.Policy.EVICT_OLDEST)
    owner.set_subscription("t", "a", "a", evict, has_own=True)
    assert not blocks  # evicting is the dispatchers' (they ack)
    owner.set_subscription("t", "a", "a", None, has_own=True)  # labels that do not parse
    owner.set_topic_quota("t", quotas.BacklogQuota(messages=4))
    assert not blocks


def test_deletes_detaches_and_moves_leave_nothing_blocked() -> None:
    owner, logs, journals, blocks = _owner()
    logs.ends = [5, 5]
    owner.set_topic_quota("t", quotas.BacklogQuota(messages=4))
    owner.set_subscription("t", "a", "a", None, has_own=False)
    assert blocks
    owner.forget_subscription("t", "a")
    assert not blocks
    owner.set_subscription("t", "a", "a", None, has_own=False)
    assert blocks
    del journals["a"]  # detached
    owner.evaluate("t")
    assert not blocks
    journals["a"] = {0: Cursor(0), 1: Cursor(0)}
    owner.evaluate("t")
    assert blocks
    owner.forget("t")  # moved to another owner (its blocks went with the topic)
    assert owner.topic_quotas == {}


def test_an_age_limit_blocks_from_when_the_oldest_unacked_message_gets_too_old() -> None:
    owner, logs, journals, blocks = _owner()
    logs.ends = [3, 0]
    owner.set_subscription("t", "a", "a", None, has_own=False)
    owner.set_topic_quota("t", quotas.BacklogQuota(age_s=3600))
    reason, from_us = blocks[("t", OWNER_BLOCK_PREFIX + "a")]
    assert "pubsubd-backlog-quota-age-seconds" in reason
    assert from_us == 0 + 3600 * 1_000_000  # the oldest (offset 0) published at 0 s
    journals["a"][0].ack_range(0, 3)
    owner.evaluate("t", "a")
    assert not blocks
