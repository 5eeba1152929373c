"""The Pub/Sub v1 REST API: Google's HTTP rules (``routes.py``), transcoding (``transcode.py``)
and the front that calls the process's own gRPC port (``front.py``)."""

from pubsubd.api.rest.front import RestFront, local_target

__all__ = ["RestFront", "local_target"]
