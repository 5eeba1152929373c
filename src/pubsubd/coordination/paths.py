"""The znode layout of a pubsubd cluster (pure: names only, no I/O).

Every path is under one root (``/pubsubd`` unless a deployment chooses another chroot-like
root, so several clusters or test runs can share one ZooKeeper). Collections that can grow to
a million children (topics, subscriptions, publish message sources) are spread over buckets
named by a hash prefix, so no parent ever has more children than ZooKeeper answers in one call
(it answers at most ~1 MB).
"""

from __future__ import annotations

import hashlib

DEFAULT_ROOT = "/pubsubd"

# 256 buckets of up to a few thousand children each keep a million names per collection
# within one getChildren answer per bucket.
BUCKETS = 256


def bucket(key: str) -> str:
    """The bucket of ``key``: two hex digits of its SHA-1, stable across processes."""
    return hashlib.sha1(key.encode("utf-8")).hexdigest()[:2]


def escape(name: str) -> str:
    """A resource name as one znode name (``/`` is not allowed inside one)."""
    return name.replace("%", "%25").replace("/", "%2F")


def unescape(node: str) -> str:
    return node.replace("%2F", "/").replace("%25", "%")


class Layout:
    """Paths of one cluster under ``root``."""

    __slots__ = ("root",)

    def __init__(self, root: str = DEFAULT_ROOT) -> None:
        if not root.startswith("/") or root.endswith("/") or "//" in root:
            raise ValueError(f"a ZooKeeper root looks like /name, got {root!r}")
        self.root = root

    # -- storage nodes ------------------------------------------------------------------

    @property
    def storage_nodes(self) -> str:
        """Parent of the storage nodes' ephemeral registrations (JSON: address, zone, ...)."""
        return f"{self.root}/storage/nodes"

    def storage_node(self, node_id: str) -> str:
        return f"{self.storage_nodes}/{escape(node_id)}"

    # -- ledgers --------------------------------------------------------------------------

    @property
    def ledger_ids(self) -> str:
        """Parent of sequential znodes whose sequence numbers are ledger IDs."""
        return f"{self.root}/ledgers/ids"

    @property
    def sources(self) -> str:
        """Parent of the buckets of publish message sources."""
        return f"{self.root}/sources"

    def source(self, topic_uid: str, source: int) -> str:
        """A publish message source: its data is the ledger list (JSON), changed by CAS."""
        return f"{self.sources}/{bucket(topic_uid)}/{topic_uid}/{source}"

    def source_owner(self, topic_uid: str, source: int) -> str:
        """Ephemeral znode of the source's one writer; its czxid is the writer's epoch."""
        return f"{self.source(topic_uid, source)}/owner"

    @property
    def auditor(self) -> str:
        """Election of the one repair auditor."""
        return f"{self.root}/auditor"

    # -- processes -----------------------------------------------------------------------

    @property
    def servers(self) -> str:
        """Parent of the serve/forwarder processes' ephemeral registrations."""
        return f"{self.root}/servers"

    # -- routing (issue 11) ----------------------------------------------------------------

    @property
    def forwarders(self) -> str:
        """Parent of the forwarders' ephemeral registrations (ForwarderInfo protos)."""
        return f"{self.root}/routing/forwarders"

    def forwarder(self, forwarder_id: str) -> str:
        return f"{self.forwarders}/{escape(forwarder_id)}"

    @property
    def forwarder_loads(self) -> str:
        """Parent of the forwarders' ephemeral load reports (LoadReport protos)."""
        return f"{self.root}/routing/loads"

    def forwarder_load(self, forwarder_id: str) -> str:
        return f"{self.forwarder_loads}/{escape(forwarder_id)}"

    @property
    def frontends(self) -> str:
        """Parent of the frontends' ephemeral registrations (JSON: id, address, zone, ...)."""
        return f"{self.root}/routing/frontends"

    def frontend(self, frontend_id: str) -> str:
        return f"{self.frontends}/{escape(frontend_id)}"

    @property
    def routing_constraints(self) -> str:
        """Drains and pins (a RoutingConstraints proto), changed by compare-and-set."""
        return f"{self.root}/routing/constraints"

    @property
    def routers(self) -> str:
        """Election of the leading router."""
        return f"{self.root}/routing/routers"

    @property
    def routing_shards(self) -> str:
        """Parent of the assignment's shards, one per bucket (AssignmentShard protos)."""
        return f"{self.root}/routing/assignment"

    def routing_shard(self, shard: str) -> str:
        return f"{self.routing_shards}/{shard}"

    @property
    def routing_summary(self) -> str:
        """The leading router's last pass (a RoutingSummary proto)."""
        return f"{self.root}/routing/summary"

    # -- metadata (topics, subscriptions, snapshots, cursors) -------------------------------

    @property
    def metadata(self) -> str:
        return f"{self.root}/metadata"
