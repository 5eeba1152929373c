"""Coordination through ZooKeeper: the client bridge, the znode layout and local ensembles.

Everything a multi-process pubsubd agrees on (metadata, ledger lists, ownership, the node
registry) lives in ZooKeeper; consensus is ZooKeeper's, never ours. ``paths`` is the layout
(pure), ``zk`` the asyncio bridge over kazoo, ``ensemble`` starts ZooKeeper processes on
loopback for ``pubsubd cluster up`` and the tests.
"""
