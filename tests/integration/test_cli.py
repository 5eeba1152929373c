"""The ``pubsubd`` command line against a running server (PUBSUB_EMULATOR_HOST).

Each CLI run costs a Python start-up, so independent commands run side by side (``cli_many``)
and state the CLI is not being tested on is set up with the official client.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import PROJECT
from tests.support.replay_client import ReplayClient
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration


def _env(server: ServerProcess) -> dict[str, str]:
    env = dict(os.environ)
    env["PUBSUB_EMULATOR_HOST"] = server.endpoint
    env["PUBSUB_PROJECT_ID"] = PROJECT
    env.pop("COLUMNS", None)  # output to a pipe: whatever width the CLI picks by itself
    return env


def cli_many(server: ServerProcess, *commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Run ``python -m pubsubd ARGS`` for each command, concurrently, output piped as in a shell."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pubsubd", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(server),
        )
        for args in commands
    ]
    results = []
    for args, proc in zip(commands, procs, strict=True):
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        results.append(subprocess.CompletedProcess(args, proc.returncode, out, err))
    return results


def cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return cli_many(server, list(args))[0]


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args}: exit {result.returncode}\n{result.stdout}"
    return result.stdout


def ok_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result))


def failed(result: subprocess.CompletedProcess[str]) -> str:
    """The text of a failed command (stdout and stderr, whitespace normalised)."""
    assert result.returncode != 0, f"{result.args}: expected failure\n{result.stdout}"
    text = " ".join((result.stdout + " " + result.stderr).split())
    assert "Traceback" not in text, text
    return text


def _short(name: str) -> str:
    return name.rsplit("/", 1)[1]


def test_topics_and_subscriptions_create_list_delete(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    pub, sub = clients
    topic, subscription = names.topic("cli"), names.subscription("cli")
    out = ok(cli(shared_server, "topics", "create", _short(topic)))
    assert topic in out
    created = ok_json(
        cli(
            shared_server,
            *("subscriptions", "create", _short(subscription), "--topic", _short(topic)),
            *("--ack-deadline", "30", "--json"),
        )
    )
    assert created == [{"name": subscription, "topic": topic, "ack_deadline_seconds": 30}]
    assert sub.get_subscription(subscription=subscription).ack_deadline_seconds == 30

    human_topics, json_topics, json_subs = cli_many(
        shared_server,
        ["topics", "list"],
        ["topics", "list", "--json"],
        ["subscriptions", "list", "--json"],
    )
    assert topic in ok(human_topics)
    assert {"name": topic} in ok_json(json_topics)
    assert {"name": subscription, "topic": topic} in ok_json(json_subs)

    # Short names and full names both work.
    deleted_sub, deleted_topic = cli_many(
        shared_server,
        ["subscriptions", "delete", subscription],
        ["topics", "delete", _short(topic), "--json"],
    )
    assert subscription in ok(deleted_sub)
    assert ok_json(deleted_topic) == [{"deleted": topic}]
    project = f"projects/{PROJECT}"
    assert topic not in {t.name for t in pub.list_topics(project=project)}
    assert subscription not in {s.name for s in sub.list_subscriptions(project=project)}


def test_human_output_shows_full_names(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    """Tables printed to a pipe keep every name whole, so `pubsubd ... | grep NAME` works."""
    pub, sub = clients
    topic, subscription = names.topic("cli-human"), names.subscription("cli-human")
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic)
    listed, created = cli_many(
        shared_server,
        ["subscriptions", "list"],
        ["subscriptions", "create", _short(subscription) + "-2", "--topic", _short(topic)],
    )
    assert subscription in ok(listed), listed.stdout
    assert subscription + "-2" in ok(created), created.stdout
    assert topic in created.stdout, created.stdout


def test_publish_and_pull(shared_server: ServerProcess, clients: Any, names: Any) -> None:
    pub, sub = clients
    topic, subscription = names.topic("cli"), names.subscription("cli")
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic)
    published = ok_json(
        cli(
            shared_server,
            *("publish", _short(topic), "hello", "w\u00f6rld"),
            *("-a", "k=v", "-a", "eq=a=b", "--json"),
        )
    )
    ids = [row["message_id"] for row in published]
    assert len(set(ids)) == 2
    # One message as a table, the other as JSON; both acknowledged.
    human = ok(cli(shared_server, "pull", _short(subscription), "--max-messages", "1", "--ack"))
    pulled = ok_json(cli(shared_server, "pull", _short(subscription), "--ack", "--json", "--wait"))
    assert len(pulled) == 1
    [row] = pulled
    other = "hello" if row["data"] == "w\u00f6rld" else "w\u00f6rld"
    assert row["data"] in ("hello", "w\u00f6rld")
    assert row["attributes"] == {"k": "v", "eq": "a=b"}
    assert row["message_id"] in ids
    assert other in human
    assert ({row["message_id"]} | {i for i in ids if i in human}) == set(ids)
    # Both were acked: nothing more to pull.
    assert ok_json(cli(shared_server, "pull", _short(subscription), "--ack", "--json")) == []


def test_errors_exit_nonzero_with_readable_message(
    shared_server: ServerProcess, clients: Any, names: Any
) -> None:
    pub, _ = clients
    topic = names.topic("cli")
    pub.create_topic(name=topic)
    duplicate, missing_sub, missing_topic, bad_attr = cli_many(
        shared_server,
        ["topics", "create", _short(topic)],
        ["pull", _short(names.subscription("missing"))],
        ["topics", "delete", _short(names.topic("missing"))],
        ["publish", _short(topic), "x", "-a", "novalue"],
    )
    text = failed(duplicate)
    assert "already exists" in text.lower() and topic in text
    assert "not found" in failed(missing_sub).lower()
    assert "not found" in failed(missing_topic).lower()
    text = failed(bad_attr)
    assert "novalue" in text and "key=value" in text


def test_invalid_name_error_shows_server_message(shared_server: ServerProcess) -> None:
    """The server's text is printed as-is (brackets included), not eaten as terminal markup."""
    text = failed(cli(shared_server, "topics", "create", "1bad"))
    assert f"Invalid [topics] name: (name=projects/{PROJECT}/topics/1bad)" in text, text


def test_cursors_list_and_delete(shared_server: ServerProcess, clients: Any, names: Any) -> None:
    pub, _ = clients
    topic = names.topic("cli-cursors")
    pub.create_topic(name=topic)
    pub.publish(topic, b"x").result(timeout=30)
    replay = ReplayClient(shared_server.endpoint)
    try:
        replay.CommitCursor(topic=topic, name="zeta", offsets={0: 1})
        alpha = replay.CommitCursor(topic=topic, name="alpha", offsets={0: 0})
    finally:
        replay.close()
    human, listed, empty = cli_many(
        shared_server,
        ["cursors", "list", _short(topic)],
        ["cursors", "list", topic, "--json"],
        ["cursors", "list", _short(names.topic("cli-cursors-none")), "--json"],
    )
    assert "alpha" in ok(human) and "zeta" in human.stdout
    rows = ok_json(listed)
    assert [(r["name"], r["offsets"]) for r in rows] == [("alpha", {"0": 0}), ("zeta", {"0": 1})]
    assert rows[0]["commit_time"].startswith(alpha.commit_time.ToDatetime().isoformat()[:19])
    assert "not found" in failed(empty).lower()  # the topic does not exist

    deleted = ok_json(cli(shared_server, "cursors", "delete", _short(topic), "zeta", "--json"))
    assert deleted == [{"topic": topic, "deleted": "zeta"}]
    after, again, missing_topic, bad_name = cli_many(
        shared_server,
        ["cursors", "list", _short(topic), "--json"],
        ["cursors", "delete", _short(topic), "zeta"],
        ["cursors", "delete", _short(names.topic("cli-cursors-none")), "alpha"],
        ["cursors", "delete", _short(topic), "x" * 257],
    )
    assert [r["name"] for r in ok_json(after)] == ["alpha"]
    text = failed(again)
    assert "NOT_FOUND" in text and "zeta" in text
    assert "not found" in failed(missing_topic).lower()
    assert "INVALID_ARGUMENT" in failed(bad_name)
