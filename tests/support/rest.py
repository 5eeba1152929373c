"""A plain HTTP/JSON client of the REST v1 API (http.client, one kept-alive connection), as
curl or any HTTP library would call it, and gcloud pointed at a server."""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any


class Rest:
    def __init__(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)

    def close(self) -> None:
        self.conn.close()

    def raw(
        self, verb: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        self.conn.request(verb, path, body=body, headers=hdrs)
        response = self.conn.getresponse()
        data = response.read()
        if response.getheader("Connection", "").lower() == "close":
            self.conn.close()
        return response.status, data

    def call(
        self, verb: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """(HTTP status, decoded JSON) of one call; ``body`` is sent as JSON when given."""
        raw = None if body is None else json.dumps(body).encode()
        status, data = self.raw(verb, path, raw, headers)
        return status, json.loads(data) if data else None

    def ok(self, verb: str, path: str, body: Any = None) -> Any:
        status, value = self.call(verb, path, body)
        assert status == 200, (verb, path, status, value)
        return value

    def error(self, verb: str, path: str, body: Any = None) -> tuple[int, str, str]:
        """(HTTP code, status name, message) of a call that must fail with Google's error body."""
        status, value = self.call(verb, path, body)
        assert status != 200, (verb, path, value)
        error = value["error"]
        assert error["code"] == status and set(error) >= {"code", "message", "status"}, value
        return status, error["status"], error["message"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def gcloud_path() -> str | None:
    return shutil.which("gcloud")


class Gcloud:
    """gcloud with its own configuration directory, no credentials, and the Pub/Sub endpoint
    overridden to a server's HTTP port: the way a user points gcloud at an emulator."""

    def __init__(self, config_dir: Path, project: str, http: str) -> None:
        self.env = {
            **os.environ,
            "CLOUDSDK_CONFIG": str(config_dir),
            "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
            "CLOUDSDK_CORE_PROJECT": project,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB": f"http://{http}/",
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
            "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
        }
        self.env.pop("PUBSUB_EMULATOR_HOST", None)

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["gcloud", "pubsub", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check:
            assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--format=json").stdout or "null")
