"""IAM policies shared by every process of a cluster (two forwarders behind a frontend, every
process started with ``PUBSUBD_IAM``): a policy set through one forwarder is read and
compare-and-set through the other, and enforced at the frontend, which follows the policies in
ZooKeeper (forwarders, behind frontends, do not check: they only name the caller)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions

from pubsubd.cluster.launcher import LocalCluster
from tests.conftest import PROJECT
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
