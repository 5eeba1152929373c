"""Replicated storage of publish message sources on storage nodes (the cluster's log).

A source is a sequence of ledgers; each ledger has one writer (the source's owner, with an
epoch from ZooKeeper), lives on ``write_quorum`` storage nodes and acknowledges an append once
``ack_quorum`` (a majority) of them have it durable. ``meta`` (pure) is a ledger list and its
rules, ``recovery`` (pure) what a new owner must copy before it closes the last ledger,
``placement`` (pure) which nodes get a new ledger, ``directory`` the ZooKeeper side (ledger
lists, ownership, the node registry), ``writer`` the replicated appends behind a ``SourceLog``,
and ``materialize`` the local copy a forwarder reads from.
"""
