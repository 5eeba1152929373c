"""``pubsubd cluster``: a whole cluster on one machine, for tests and trials.

``launcher`` starts a ZooKeeper ensemble, storage nodes and a ``pubsubd serve --cluster``
process on loopback, records every PID under the cluster's directory, and stops exactly those.
"""
