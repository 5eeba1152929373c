"""The Apache Pulsar binary protocol front (``--pulsar-port``, default 6650).

A gateway: each Pulsar connection is served by calling this process's own gRPC API (Publish,
the Replay API's PublishDeduplicated, StreamingPull, the admin methods), so every rule stays in
one place. The pure parts (frames, batches, compression, names, message IDs, error mapping) do
no I/O; ``connection.py`` and ``server.py`` are the asyncio shell.
"""
