"""Logging set-up for the server process (the only place handlers are configured)."""

from __future__ import annotations

import logging
import sys


def setup(level: str = "INFO") -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # httpx (push subscriptions) logs every request at INFO; keep that for DEBUG runs only.
    if level.upper() != "DEBUG":
        logging.getLogger("httpx").setLevel(logging.WARNING)
