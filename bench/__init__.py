"""Benchmark suite of pubsubd: publish throughput, end-to-end latency and backlog drain.

Each workload runs against pubsubd, Google's Pub/Sub emulator and a "null server" (the official
client's own ceiling). ``python -m bench.run`` (``make bench``) starts the targets, runs every
measurement in a fresh client subprocess (``bench.worker``), prints markdown tables and saves the
raw results as JSON under ``bench/results/``.
"""

import os

# The servers the benchmarks start leave the Pulsar front off unless one asks for it (a port
# of its own): several servers at once would all try to bind its default port, 6650.
os.environ.setdefault("PUBSUBD_PULSAR_PORT", "-1")
