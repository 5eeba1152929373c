"""Benchmark suite of pubsubd: publish throughput, end-to-end latency and backlog drain.

Each workload runs against pubsubd, Google's Pub/Sub emulator and a "null server" (the official
client's own ceiling). ``python -m bench.run`` (``make bench``) starts the targets, runs every
measurement in a fresh client subprocess (``bench.worker``), prints markdown tables and saves the
raw results as JSON under ``bench/results/``.
"""
