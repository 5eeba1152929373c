"""IAM policies shared by every process of a cluster (two forwarders behind a frontend, every
process started with ``PUBSUBD_IAM``): a policy set through one forwarder is read and
compare-and-set through the other, and enforced at the frontend, which follows the policies in
ZooKeeper (forwarders, behind frontends, do not check: they only name the caller). Two
SetIamPolicy calls with the same etag through the two forwarders at once: exactly one wins."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions

from pubsubd.cluster.launcher import LocalCluster
from tests.conftest import PROJECT
from tests.support.at_once import at_once
from tests.support.cluster import environment, running_cluster
from tests.support.iam import publisher_as
from tests.support.server import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

ADMIN = "user:admin@example.com"
ALICE = "user:alice@example.com"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("iam-cluster")
    policy_file = directory / "iam-policy.json"
    policy_file.write_text(
        json.dumps({"projects": {"*": {"bindings": [{"role": "roles/owner", "members": [ADMIN]}]}}})
    )
    env = {
        "PUBSUBD_IAM": "1",
        "PUBSUBD_TRUST_CALLER_HEADER": "1",
        "PUBSUBD_IAM_POLICY_FILE": str(policy_file),
    }
    with (
        environment(env),  # every process of the cluster inherits it
        running_cluster(
            directory / "c",
            zk_nodes=1,
            storage_nodes=1,
            replicas=1,
            routers=1,
            frontends=1,
            forwarders=2,
        ) as c,
    ):
        yield c


def _forwarders(cluster: LocalCluster) -> list[str]:
    return [p.address for p in cluster.processes if p.role == "forwarder"]


def test_a_policy_set_through_one_process_holds_in_every_other(
    cluster: LocalCluster, names: Any
) -> None:
    frontend = cluster.frontends[0]
    first, second = _forwarders(cluster)
    topic = f"projects/{PROJECT}/topics/shared-{names.suffix}"
    publisher_as(frontend, ADMIN).create_topic(name=topic)
    on_first = publisher_as(first, ADMIN)
    policy = on_first.get_iam_policy(request={"resource": topic})
    stale = policy.etag
    policy.bindings.add(role="roles/pubsub.publisher", members=[ALICE])
    written = on_first.set_iam_policy(request={"resource": topic, "policy": policy})

    # Read back and compare-and-set through the other forwarder.
    on_second = publisher_as(second, ADMIN)
    assert on_second.get_iam_policy(request={"resource": topic}) == written
    policy.etag = stale
    with pytest.raises(exceptions.Aborted):
        on_second.set_iam_policy(request={"resource": topic, "policy": policy})

    # Enforced at the frontend, which follows the policies in ZooKeeper.
    alice = publisher_as(frontend, ALICE)

    def published() -> bool:
        try:
            alice.publish(topic, b"x").result(timeout=30)
        except exceptions.PermissionDenied:
            return False
        return True

    wait_for(published, 10, "alice's grant to reach the frontend")
    bob = publisher_as(frontend, "user:bob@example.com")
    # The forwarder answering through the frontend knows who asks.
    asked = {"resource": topic, "permissions": ["pubsub.topics.publish", "pubsub.topics.get"]}
    assert list(alice.test_iam_permissions(request=asked).permissions) == ["pubsub.topics.publish"]
    assert list(bob.test_iam_permissions(request=asked).permissions) == []
    with pytest.raises(exceptions.PermissionDenied, match=r"pubsub\.topics\.publish"):
        bob.publish(topic, b"x").result(timeout=30)
    with pytest.raises(exceptions.PermissionDenied, match=r"pubsub\.topics\.get"):
        publisher_as(frontend, None).get_topic(topic=topic)
    # The frontend refused them itself.
    args = cluster.process("frontend-1").args
    http = args[args.index("--http-port") + 1]
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert 'pubsubd_iam_denied_total{method="Publish"}' in metrics
    assert 'pubsubd_iam_denied_total{method="GetTopic"} 1.0' in metrics


def _race(clients: list[Any], topic: str, tag: str) -> list[Any]:
    """Both clients read the policy (one etag), then set it at the same instant; each outcome
    is the policy written or the ABORTED error."""
    etag = clients[0].get_iam_policy(request={"resource": topic}).etag
    wait_for(
        lambda: clients[1].get_iam_policy(request={"resource": topic}).etag == etag,
        10,
        "the second forwarder to see the policy",
    )
    policies = []
    for i, client in enumerate(clients):
        policy = client.get_iam_policy(request={"resource": topic})
        assert policy.etag == etag
        policy.bindings.add(role="roles/pubsub.viewer", members=[f"user:{tag}-{i}@example.com"])
        policies.append(policy)
    return at_once(
        [
            lambda c=c, p=p: c.set_iam_policy(request={"resource": topic, "policy": p})
            for c, p in zip(clients, policies, strict=True)
        ]
    )


def test_two_forwarders_setting_one_policy_from_the_same_etag_at_once_one_wins(
    cluster: LocalCluster, names: Any
) -> None:
    """Both calls may pass their forwarder's etag check before either writes: the write is a
    compare-and-set on the policy's znode, so the loser answers ABORTED, never overwriting."""
    first, second = _forwarders(cluster)
    topic = f"projects/{PROJECT}/topics/raced-{names.suffix}"
    publisher_as(first, ADMIN).create_topic(name=topic)
    clients = [publisher_as(first, ADMIN), publisher_as(second, ADMIN)]
    for round_ in range(5):
        outcomes = _race(clients, topic, f"u{round_}")
        won = [o for o in outcomes if o is not None and not isinstance(o, Exception)]
        lost = [o for o in outcomes if isinstance(o, exceptions.Aborted)]
        assert (len(won), len(lost)) == (1, 1), outcomes
        for client in clients:  # what is stored is the winner's policy, everywhere
            wait_for(
                lambda c=client, w=won[0]: c.get_iam_policy(request={"resource": topic}) == w,
                10,
                "every forwarder to hold the winner's policy",
            )
