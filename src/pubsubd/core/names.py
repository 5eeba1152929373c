"""Resource names of google.pubsub.v1 (projects/P/topics/T, ...), validated once.

Rules (docs/GOOGLE_API.md §2): the resource ID is 3-255 characters, starts with a letter, uses
only letters, digits and ``- _ . ~ + %``, and must not start with ``goog``. Project IDs are not
validated beyond being non-empty and slash-free, as the Google emulator does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pubsubd.core.errors import InvalidResourceName

# The topic a subscription shows once its topic has been deleted.
DELETED_TOPIC = "_deleted-topic_"

_ID = re.compile(r"[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}")
_PROJECT = re.compile(r"projects/([^/]+)")


@dataclass(frozen=True, slots=True)
class ResourceName:
    project: str
    collection: str  # "topics", "subscriptions", "snapshots"
    id: str

    def __str__(self) -> str:
        return f"projects/{self.project}/{self.collection}/{self.id}"


def _check_id(kind: str, name: str, rid: str) -> None:
    if not _ID.fullmatch(rid):
        if not 3 <= len(rid) <= 255:
            raise InvalidResourceName(kind, name, "the ID must be 3-255 characters long")
        if not rid[:1].isalpha():
            raise InvalidResourceName(kind, name, "the ID must start with a letter")
        raise InvalidResourceName(
            kind, name, "the ID may contain only letters, digits and - _ . ~ + %"
        )
    if rid.lower().startswith("goog"):
        raise InvalidResourceName(kind, name, "the ID must not start with 'goog'")


def parse(name: str, collection: str) -> ResourceName:
    """Parse and validate ``projects/{project}/{collection}/{id}``; raise InvalidResourceName."""
    parts = name.split("/")
    if len(parts) != 4 or parts[0] != "projects" or not parts[1] or parts[2] != collection:
        raise InvalidResourceName(
            collection, name, f"expected projects/{{project}}/{collection}/{{id}}"
        )
    _check_id(collection, name, parts[3])
    return ResourceName(parts[1], collection, parts[3])


def topic(name: str) -> str:
    """Validate a topic name and return it unchanged."""
    parse(name, "topics")
    return name


def subscription(name: str) -> str:
    """Validate a subscription name and return it unchanged."""
    parse(name, "subscriptions")
    return name


def snapshot(name: str) -> str:
    """Validate a snapshot name and return it unchanged."""
    parse(name, "snapshots")
    return name


def project(name: str) -> str:
    """Validate ``projects/{project}`` and return the project ID."""
    m = _PROJECT.fullmatch(name)
    if not m:
        raise InvalidResourceName("projects", name, "expected projects/{project}")
    return m.group(1)
