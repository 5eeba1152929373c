"""The official Node client (``@google-cloud/pubsub``) for tests: run one of the scenario scripts
under ``tests/node/`` against a server and read the JSON line of results it prints.

``make test`` installs Node.js and npm from Debian when they are missing and ``npm ci``s the
client pinned by ``tests/node/package-lock.json`` into ``tests/node/node_modules``. A script
reaches the server the way users point the client at an emulator: ``PUBSUB_EMULATOR_HOST``.
``METADATA_SERVER_DETECTION=none`` keeps the client's auth library from probing for a GCE
metadata server (an address off this machine) while it builds its stubs; with an emulator host
it needs no credentials.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

NODE_DIR = Path(__file__).resolve().parent.parent / "node"
CLIENT_PACKAGE = NODE_DIR / "node_modules" / "@google-cloud" / "pubsub" / "package.json"
INSTALL_HINT = "`make test` installs it (apt-get install nodejs npm; cd tests/node && npm ci)"


def node_binary() -> str:
    """The ``node`` to run (``$NODE``, which the Makefile exports, or the one on PATH)."""
    return os.environ.get("NODE") or shutil.which("node") or "/usr/bin/node"


def require() -> None:
    """Fail (not skip) without Node.js or the client: these tests are part of the suite."""
    if shutil.which(node_binary()) is None:
        pytest.fail(f"Node.js is missing ({node_binary()}): {INSTALL_HINT}")
    if not CLIENT_PACKAGE.exists():
        pytest.fail(f"@google-cloud/pubsub is not installed in {NODE_DIR}: {INSTALL_HINT}")


def client_version() -> str:
    return str(json.loads(CLIENT_PACKAGE.read_text())["version"])


@dataclass
class ScenarioRun:
    result: dict[str, Any]
    seconds: float  # wall time of the node process, start-up included


def run_scenario(
    script: str, endpoint: str, args: dict[str, Any], timeout: float = 60.0
) -> ScenarioRun:
    """Run ``tests/node/<script>`` with ``args`` (one JSON argument) against ``endpoint``; its
    results. Fails with the script's output if it exits non-zero or prints no JSON line."""
    env = {**os.environ, "PUBSUB_EMULATOR_HOST": endpoint, "METADATA_SERVER_DETECTION": "none"}
    started = time.monotonic()
    proc = subprocess.run(
        [node_binary(), str(NODE_DIR / script), json.dumps(args)],
        cwd=NODE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    seconds = time.monotonic() - started
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(
            f"node {script} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return ScenarioRun(dict(json.loads(lines[-1])), seconds)
