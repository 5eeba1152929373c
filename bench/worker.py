"""One measurement in a fresh process: ``python -m bench.worker SPEC_JSON``.

SPEC_JSON is ``{"workload": NAME, "endpoint": "host:port", "server_pid": PID | null,
"params": {...}}``, optionally with ``"watch": {NAME: PID}``: more processes of the target whose
CPU time every measurement reads (a cluster's storage nodes and ZooKeeper). The official client
finds the target through ``PUBSUB_EMULATOR_HOST``, which the runner sets to the same endpoint.
The result is printed as one line ``RESULT {json}`` on stdout; anything else the process prints
is diagnostics.
"""

from __future__ import annotations

import json
import os
import sys

from bench.workloads import WATCHED, WORKLOADS

RESULT_PREFIX = "RESULT "


def main() -> None:
    spec = json.loads(sys.argv[1])
    fn = WORKLOADS[spec["workload"]]
    WATCHED.update(spec.get("watch") or {})
    result = fn(spec["endpoint"], spec.get("server_pid"), **spec["params"])
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: client background threads can take seconds to wind down.
    os._exit(0)


if __name__ == "__main__":
    main()
