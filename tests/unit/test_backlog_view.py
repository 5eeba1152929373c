"""A subscription's whole backlog from its forwarders' shares (core/backlog_view.py), and the
shares' way through a load report (control/routing_store.py)."""

from __future__ import annotations

import pytest

from pubsubd.control.routing_store import decode_forwarder_report, encode_load_report
from pubsubd.core.backlog_view import BacklogShare, bounded, ranked, whole_backlogs
from pubsubd.core.load import Load

pytestmark = pytest.mark.unit

NAME = "projects/p/subscriptions/s"


def share(sources: tuple[int, ...], messages: int, age: float = 1.0) -> BacklogShare:
    return BacklogShare(NAME, sources, 8, messages, messages * 100, age, spread=True)


def test_the_whole_is_the_sum_of_the_shares_and_says_who_serves_which_sources() -> None:
    whole = whole_backlogs(
        [
            ("f2", 100.0, {"u": share((0, 2, 4, 6), 65, age=3.0)}),
            ("f3", 102.0, {"u": share((1, 3, 5, 7), 95, age=7.5)}),
        ]
    )["u"]
    assert (whole.messages, whole.bytes, whole.oldest_unacked_age_s) == (160, 16_000, 7.5)
    assert whole.complete and whole.spread and whole.as_of_unix_s == 100.0
    shown = whole.as_json()
    assert shown["backlog_messages"] == 160 and shown["subscription"] == NAME
    assert shown["forwarders"] == {
        "f2": {
            "sources": [0, 2, 4, 6],
            "backlog_messages": 65,
            "backlog_bytes": 6500,
            "oldest_unacked_age_s": 3.0,
        },
        "f3": {
            "sources": [1, 3, 5, 7],
            "backlog_messages": 95,
            "backlog_bytes": 9500,
            "oldest_unacked_age_s": 7.5,
        },
    }


def test_a_source_moving_between_reports_is_shown_missing_or_twice() -> None:
    # f3's report is from before it took source 7 over from f2, or f2's from before it let go.
    missing = whole_backlogs(
        [("f2", 1.0, {"u": share((0, 1, 2, 3), 4)}), ("f3", 1.0, {"u": share((4, 5, 6), 3)})]
    )["u"]
    assert missing.missing_sources == (7,) and not missing.complete
    doubled = whole_backlogs(
        [("f2", 1.0, {"u": share((0, 1, 2, 3, 7), 5)}), ("f3", 1.0, {"u": share((4, 5, 6, 7), 4)})]
    )["u"]
    assert doubled.doubled_sources == (7,) and doubled.missing_sources == ()
    assert doubled.messages == 9  # still the sum: the figure is high while it lasts


def test_the_report_of_a_forwarder_no_longer_registered_is_left_out() -> None:
    # f2 was killed: the router deleted its registration, f3 took its sources over, and f2's
    # report stays until its session expires.
    reports = [
        ("f2", 1.0, {"u": share((0, 2, 4, 6), 40)}),
        ("f3", 3.0, {"u": share(tuple(range(8)), 70)}),
    ]
    assert whole_backlogs(reports)["u"].doubled_sources == (0, 2, 4, 6)
    whole = whole_backlogs(reports, registered={"f3"})["u"]
    assert whole.complete and whole.messages == 70 and set(whole.shares) == {"f3"}
    assert whole_backlogs(reports, registered=set()) == {}


def test_a_subscription_served_whole_is_its_one_share() -> None:
    whole = BacklogShare("projects/p/subscriptions/w", tuple(range(3)), 3, 12, 1200, 2.0, False)
    found = whole_backlogs([("f1", 5.0, {"w": whole}), ("f2", 5.0, {})])
    assert set(found) == {"w"}
    assert found["w"].complete and not found["w"].spread and found["w"].messages == 12


def test_a_report_keeps_the_spread_shares_and_the_largest_backlogs_within_its_bound() -> None:
    shares = {f"w{i}": BacklogShare(f"w{i}", (0,), 1, i, i, 0.0, False) for i in range(1, 6)} | {
        "s": share((0,), 0)
    }
    kept, left_out = bounded(shares, limit=3)
    assert set(kept) == {"s", "w5", "w4"} and left_out == 3
    assert bounded(shares, limit=10) == (shares, 0)
    listed = ranked(whole_backlogs([("f", 1.0, shares)]).values())
    assert [b.uid for b in listed] == ["s", "w5", "w4", "w3", "w2", "w1"]


def test_shares_go_through_a_load_report_and_an_earlier_release_s_report_has_none() -> None:
    s = share((1, 3), 42, age=2.25)
    data = encode_load_report("f2", {"t": Load(1.0, 2.0, 3)}, 9.5, {}, ({"u": s}, 4))
    report = decode_forwarder_report(data)
    assert report.forwarder_id == "f2" and report.at_unix_s == 9.5
    assert report.shares == {"u": s} and report.shares_left_out == 4
    assert report.topics == {"t": Load(1.0, 2.0, 3)}
    older = decode_forwarder_report(encode_load_report("f1", {}, 1.0, {}))
    assert older.shares == {} and older.shares_left_out == 0
