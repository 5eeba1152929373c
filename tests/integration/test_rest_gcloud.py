"""gcloud against a real ``pubsubd serve`` through REST v1, the way a user points it at an
emulator: ``CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB=http://127.0.0.1:PORT/`` and credentials off.
One server and one gcloud configuration for the module; gcloud takes about a second a call, so
the tests walk a representative set of commands in a few flows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import PROJECT, make_publisher, make_subscriber
from tests.support.rest import Gcloud, gcloud_path
from tests.support.server import ServerProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.skipif(gcloud_path() is None, reason="gcloud (google-cloud-cli) is not installed"),
    pytest.mark.filterwarnings("ignore:The return_immediately flag is deprecated"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("gcloud") / "data").start()
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def gcloud(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Gcloud:
    return Gcloud(
        tmp_path_factory.mktemp("gcloud-config"), PROJECT, f"127.0.0.1:{server.http_port}"
    )


def test_topics(gcloud: Gcloud, names: Any) -> None:
    topic = f"gtopic-{names.suffix}"
    created = gcloud.run("topics", "create", topic, "--labels=team=a")
    assert f"Created topic [projects/{PROJECT}/topics/{topic}]" in created.stderr
    described = gcloud.json("topics", "describe", topic)
    assert described["name"] == f"projects/{PROJECT}/topics/{topic}"
    assert described["labels"] == {"team": "a"}
    gcloud.run("topics", "update", topic, "--update-labels=team=b")
    assert gcloud.json("topics", "describe", topic)["labels"] == {"team": "b"}
    listed = gcloud.json("topics", "list")
    assert f"projects/{PROJECT}/topics/{topic}" in [t["name"] for t in listed]
    published = gcloud.json("topics", "publish", topic, "--message=hello", "--attribute=k=v")
    assert len(published["messageIds"]) == 1
    again = gcloud.run("topics", "create", topic, check=False)
    assert again.returncode != 0 and "Topic already exists" in again.stderr
    gcloud.run("topics", "delete", topic)
    missing = gcloud.run("topics", "describe", topic, check=False)
    assert missing.returncode != 0 and "NOT_FOUND" in missing.stderr


def test_subscriptions_pull_ack_seek(gcloud: Gcloud, names: Any) -> None:
    topic, sub = f"gtopic2-{names.suffix}", f"gsub-{names.suffix}"
    gcloud.run("topics", "create", topic)
    gcloud.run(
        "subscriptions", "create", sub, f"--topic={topic}", "--ack-deadline=30",
        "--retain-acked-messages",
    )  # fmt: skip
    assert gcloud.json("subscriptions", "describe", sub)["ackDeadlineSeconds"] == 30
    gcloud.run("topics", "publish", topic, "--message=first", "--attribute=n=1")
    # Pull without acking, extend the lease, then ack by ID.
    (got,) = gcloud.json("subscriptions", "pull", sub, "--limit=1")
    assert got["message"]["attributes"] == {"n": "1"}
    ack_id = got["ackId"]
    gcloud.run(
        "subscriptions",
        "modify-message-ack-deadline",
        sub,
        f"--ack-ids={ack_id}",
        "--ack-deadline=60",
    )
    gcloud.run("subscriptions", "ack", sub, f"--ack-ids={ack_id}")
    # Seek back to the start: the acked (retained) message comes again; --auto-ack acks it.
    gcloud.run("subscriptions", "seek", sub, "--time=2000-01-01T00:00:00Z")
    (again,) = gcloud.json("subscriptions", "pull", sub, "--auto-ack", "--limit=5")
    assert again["message"]["messageId"] == got["message"]["messageId"]
    gcloud.run("subscriptions", "update", sub, "--ack-deadline=45")
    assert gcloud.json("subscriptions", "describe", sub)["ackDeadlineSeconds"] == 45
    subs = gcloud.json("topics", "list-subscriptions", topic)
    assert subs == [f"projects/{PROJECT}/subscriptions/{sub}"]
    gcloud.run("subscriptions", "delete", sub)
    gone = gcloud.run("subscriptions", "describe", sub, check=False)
    assert gone.returncode != 0 and "NOT_FOUND" in gone.stderr


def test_snapshots(gcloud: Gcloud, names: Any) -> None:
    topic, sub, snap = f"gtopic3-{names.suffix}", f"gsub3-{names.suffix}", f"gsnap-{names.suffix}"
    gcloud.run("topics", "create", topic)
    gcloud.run("subscriptions", "create", sub, f"--topic={topic}")
    gcloud.run("topics", "publish", topic, "--message=kept")
    gcloud.run("snapshots", "create", snap, f"--subscription={sub}")
    listed = gcloud.json("snapshots", "list")
    assert f"projects/{PROJECT}/snapshots/{snap}" in [s["name"] for s in listed]
    (first,) = gcloud.json("subscriptions", "pull", sub, "--auto-ack")
    gcloud.run("subscriptions", "seek", sub, f"--snapshot={snap}")
    (again,) = gcloud.json("subscriptions", "pull", sub, "--auto-ack")
    assert again["message"]["messageId"] == first["message"]["messageId"]
    gcloud.run("snapshots", "delete", snap)
    assert f"projects/{PROJECT}/snapshots/{snap}" not in [
        s["name"] for s in gcloud.json("snapshots", "list")
    ]


def test_gcloud_and_the_grpc_client_share_messages(
    server: ServerProcess, gcloud: Gcloud, names: Any
) -> None:
    """Published with gcloud (REST), pulled with the official client (gRPC), and the reverse."""
    topic, sub = f"gtopic4-{names.suffix}", f"gsub4-{names.suffix}"
    gcloud.run("topics", "create", topic)
    gcloud.run("subscriptions", "create", sub, f"--topic={topic}")
    (sent,) = gcloud.json("topics", "publish", topic, "--message=from-gcloud")["messageIds"]
    subscriber = make_subscriber(server.endpoint)
    publisher = make_publisher(server.endpoint)
    try:
        full = f"projects/{PROJECT}/subscriptions/{sub}"
        resp = subscriber.pull(request={"subscription": full, "max_messages": 10}, timeout=10)
        (m,) = resp.received_messages
        assert (m.message.data, m.message.message_id) == (b"from-gcloud", sent)
        subscriber.acknowledge(request={"subscription": full, "ack_ids": [m.ack_id]})
        publisher.publish(f"projects/{PROJECT}/topics/{topic}", b"from-grpc", k="v").result(30)
    finally:
        subscriber.close()
    (got,) = gcloud.json("subscriptions", "pull", sub, "--auto-ack")
    assert got["message"]["attributes"] == {"k": "v"}
    assert got["message"]["data"] == "ZnJvbS1ncnBj"  # base64 of b"from-grpc"
