"""``pubsubd storage``: a storage node, one failure domain holding ledgers on its M disks.

``ledger_index`` (pure) is one ledger's in-memory index and the append rules, ``ledger_store``
the ledgers on the node's data directories (majority writes, fencing, start-up repair),
``service`` the gRPC servicer of proto/pubsubd/internal/v1/storage.proto, ``main`` the process
(composition root, ZooKeeper registration, /healthz and /metrics). Callers use
``pubsubd.storage.node_client``.
"""
