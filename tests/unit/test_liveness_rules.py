"""The rules that declare an ephemeral znode's process dead before its session expires
(core/liveness.py), pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pubsubd.core.liveness import (
    Liveness,
    ProcessIdentity,
    Suspicion,
    local_verdict,
    probe_verdict,
)

pytestmark = pytest.mark.unit

HERE = ProcessIdentity("h1", 100, boot="b1", pidns="pid:[1]", started=5000, address="a:1")
OWNER = ProcessIdentity("h1", 200, boot="b1", pidns="pid:[1]", started=4000, address="a:2")


def test_an_identity_round_trips_and_an_old_one_is_still_read() -> None:
    assert ProcessIdentity.decode(OWNER.encode()) == OWNER
    old = ProcessIdentity.decode(b'{"host": "h1", "pid": 7}')
    assert old == ProcessIdentity("h1", 7)
    assert ProcessIdentity.decode(b"not json") is None
    assert ProcessIdentity.decode(b'{"host": "h1"}') is None
    assert ProcessIdentity.decode(b"[1, 2]") is None


def test_a_pid_gone_on_this_machine_is_dead() -> None:
    assert local_verdict(OWNER, HERE, None) is Liveness.DEAD


def test_a_reused_pid_is_dead_and_the_same_process_alive() -> None:
    assert local_verdict(OWNER, HERE, 4001) is Liveness.DEAD
    assert local_verdict(OWNER, HERE, 4000) is Liveness.ALIVE
    assert local_verdict(HERE, HERE, None) is Liveness.ALIVE  # this very process


def test_an_owner_without_a_start_time_is_alive_while_its_pid_is() -> None:
    old = ProcessIdentity("h1", 200, boot="b1", pidns="pid:[1]")
    assert local_verdict(old, HERE, 1234) is Liveness.ALIVE
    assert local_verdict(old, HERE, None) is Liveness.DEAD


@pytest.mark.parametrize(
    "owner",
    [
        ProcessIdentity("h2", 200, boot="b2", pidns="pid:[1]", started=4000),  # another boot
        ProcessIdentity("h1", 200, boot="b1", pidns="pid:[2]", started=4000),  # a container
        ProcessIdentity("h1", 200),  # an earlier release's znode: no boot ID
    ],
)
def test_a_pid_of_another_machine_or_namespace_proves_nothing(owner: ProcessIdentity) -> None:
    assert local_verdict(owner, HERE, None) is Liveness.UNKNOWN
    assert local_verdict(owner, HERE, 4000) is Liveness.UNKNOWN


def test_an_address_that_refuses_is_dead_and_a_timeout_unknown() -> None:
    refused = (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
        "Failed to connect to remote host: Connection refused"
    )
    assert probe_verdict(refused, None, 7) is Liveness.DEAD
    assert probe_verdict("Deadline Exceeded", None, 7) is Liveness.UNKNOWN
    assert probe_verdict("Method not found!", None, 7) is Liveness.UNKNOWN  # an older release
    assert probe_verdict("No route to host", None, 7) is Liveness.UNKNOWN


def test_an_address_answering_with_another_session_is_dead() -> None:
    assert probe_verdict(None, 7, 7) is Liveness.ALIVE
    assert probe_verdict(None, 8, 7) is Liveness.DEAD  # restarted on the same port
    assert probe_verdict(None, 0, 7) is Liveness.UNKNOWN  # between sessions: maybe the owner


def test_suspicion_needs_strikes_in_a_row() -> None:
    s = Suspicion(strikes=2)
    assert not s.observe("f1", Liveness.DEAD)
    assert not s.observe("f1", Liveness.UNKNOWN)  # the count starts again
    assert not s.observe("f1", Liveness.DEAD)
    assert s.observe("f1", Liveness.DEAD)
    assert not s.observe("f1", Liveness.DEAD)  # counted afresh after a declaration
    s.keep_only(set())
    assert not s.observe("f1", Liveness.DEAD)
    with pytest.raises(ValueError):
        Suspicion(0)


@given(st.lists(st.sampled_from(list(Liveness)), max_size=40), st.integers(1, 4))
def test_suspicion_declares_exactly_after_each_run_of_strikes(
    verdicts: list[Liveness], strikes: int
) -> None:
    s = Suspicion(strikes)
    run = 0
    for verdict in verdicts:
        run = run + 1 if verdict is Liveness.DEAD else 0
        declared = s.observe("f", verdict)
        assert declared == (run == strikes)
        if declared:
            run = 0
