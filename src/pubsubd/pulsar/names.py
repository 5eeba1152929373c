"""Topic and subscription names: Pulsar <-> Google (pure). The rule, both ways:

- ``persistent://TENANT/NAMESPACE/TOPIC`` is ``projects/TENANT/topics/TOPIC`` when NAMESPACE is
  ``default``, otherwise ``projects/TENANT/topics/NAMESPACE.TOPIC``. Short forms follow Pulsar:
  ``TOPIC`` is ``persistent://public/default/TOPIC``, ``TENANT/NAMESPACE/TOPIC`` is
  ``persistent://TENANT/NAMESPACE/TOPIC``.
- ``projects/P/topics/T`` is ``persistent://P/default/T`` (which maps back to it).
- A Pulsar subscription S of the topic whose Google name is ``projects/P/topics/T`` is
  ``projects/P/subscriptions/T.S``: Pulsar subscriptions belong to their topic, Google's to the
  project, and the topic ID keeps two topics' subscriptions named S apart. A Pulsar
  subscription name that is a full Google name, ``projects/P/subscriptions/X``, names that
  subscription as it is (one made with the Google API, for instance); it must be of the topic.
- ``TOPIC-partition-N`` is partition N of TOPIC: the same Google topic, its publish message
  source N (a topic with K > 1 sources is a Pulsar topic of K partitions).
- ``non-persistent://`` topics are refused: every pubsubd topic is persistent.
- Namespace listing (GET_TOPICS_OF_NAMESPACE, ``namespace_topics``): the topics of namespace
  ``TENANT/NS`` are the topics of project TENANT whose ID is ``NS.TOPIC`` (NS not ``default``)
  or, for ``default``, whose ID has no dot; each topic is listed in one namespace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pubsubd.core.publish_sources import MAX_SOURCES

DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._~%+-]*$")
_PARTITION = re.compile(r"^(.+)-partition-(\d+)$")


class InvalidName(ValueError):
    """A name the front cannot map (answered with NotAllowedError, naming the problem)."""


@dataclass(frozen=True, slots=True)
class TopicName:
    tenant: str
    namespace: str
    local: str  # without the partition suffix
    partition: int | None = None  # TOPIC-partition-N: N, the publish message source

    @property
    def pulsar(self) -> str:
        suffix = "" if self.partition is None else f"-partition-{self.partition}"
        return f"persistent://{self.tenant}/{self.namespace}/{self.local}{suffix}"

    @property
    def google(self) -> str:
        topic_id = (
            self.local if self.namespace == DEFAULT_NAMESPACE else f"{self.namespace}.{self.local}"
        )
        return f"projects/{self.tenant}/topics/{topic_id}"

    @property
    def topic_id(self) -> str:
        return self.google.rsplit("/", 1)[1]

    def subscription(self, name: str) -> str:
        parts = name.split("/")
        if len(parts) == 4 and parts[0] == "projects" and parts[2] == "subscriptions":
            return name
        if not name or not _PART.match(name):
            raise InvalidName(f"subscription name {name!r} cannot be part of a subscription ID")
        return f"projects/{self.tenant}/subscriptions/{self.topic_id}.{name}"


def parse_topic(name: str) -> TopicName:
    """The Pulsar topic ``name`` (full or short form); InvalidName if it cannot be mapped."""
    if name.startswith("non-persistent://"):
        raise InvalidName(
            f"{name}: non-persistent topics are not supported (every topic is stored)"
        )
    rest = name.removeprefix("persistent://")
    parts = rest.split("/")
    if len(parts) == 1 and "://" not in name:
        parts = [DEFAULT_TENANT, DEFAULT_NAMESPACE, parts[0]]
    if len(parts) != 3 or not all(_PART.match(p) for p in parts):
        raise InvalidName(f"{name}: expected persistent://TENANT/NAMESPACE/TOPIC")
    tenant, namespace, local = parts
    partition = None
    suffixed = _PARTITION.match(local)
    if suffixed:
        local, partition = suffixed.group(1), int(suffixed.group(2))
        if partition >= MAX_SOURCES:
            raise InvalidName(f"{name}: a topic has at most {MAX_SOURCES} partitions (sources)")
    if not local[0].isalpha():
        raise InvalidName(f"{name}: a Google topic ID must start with a letter")
    return TopicName(tenant, namespace, local, partition)


def from_google(topic: str) -> TopicName:
    """The Pulsar name of the Google topic ``projects/P/topics/T``."""
    parts = topic.split("/")
    if len(parts) != 4 or parts[0] != "projects" or parts[2] != "topics":
        raise InvalidName(f"{topic}: expected projects/PROJECT/topics/TOPIC")
    return TopicName(parts[1], DEFAULT_NAMESPACE, parts[3])


def parse_namespace(namespace: str) -> tuple[str, str]:
    """(tenant, namespace) of ``TENANT/NAMESPACE``; InvalidName if it cannot be mapped."""
    parts = namespace.split("/")
    if len(parts) != 2 or not all(_PART.match(p) for p in parts):
        raise InvalidName(f"namespace {namespace!r}: expected TENANT/NAMESPACE")
    return parts[0], parts[1]


def namespace_topics(namespace: str, google_topics: list[str]) -> list[str]:
    """The Pulsar names (``persistent://TENANT/NS/TOPIC``) of the Google topics (of project
    TENANT) that are in namespace ``TENANT/NS``, by the rule above."""
    tenant, ns = parse_namespace(namespace)
    out = []
    for topic in google_topics:
        parts = topic.split("/")
        if len(parts) != 4 or parts[1] != tenant:
            continue
        topic_id = parts[3]
        if ns == DEFAULT_NAMESPACE:
            local = topic_id if "." not in topic_id else ""
        else:
            local = topic_id.removeprefix(f"{ns}.") if topic_id.startswith(f"{ns}.") else ""
        if local and _PART.match(local) and local[0].isalpha():
            out.append(TopicName(tenant, ns, local).pulsar)
    return out
