"""The pubsubd release this process runs (registrations carry it, so mixed versions show)."""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    try:
        return metadata.version("pubsubd")
    except metadata.PackageNotFoundError:
        return "unknown"
