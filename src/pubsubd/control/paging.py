"""Paging of name listings and update masks, Google's way (docs/GOOGLE_API.md §3): shared by the
catalog and snapshots.

Listings page in name order; a page token is the last name returned, base64-encoded (opaque to
clients, and valid across restarts). An update mask names the fields to copy; a masked field
unset in the request is cleared.
"""

from __future__ import annotations

import base64
import bisect
from typing import Any

from pubsubd.core import pb
from pubsubd.core.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


class SortedNames:
    """Names kept sorted for paging; page tokens are the last name returned, base64-encoded."""

    __slots__ = ("names",)

    def __init__(self, names: list[str] | None = None) -> None:
        self.names: list[str] = names if names is not None else []

    def add(self, name: str) -> None:
        bisect.insort(self.names, name)

    def remove(self, name: str) -> None:
        i = bisect.bisect_left(self.names, name)
        if i < len(self.names) and self.names[i] == name:
            del self.names[i]

    def page(self, prefix: str, page_size: int, token: str) -> tuple[list[str], str]:
        if page_size < 0:
            raise InvalidArgument("page_size: must not be negative")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        after = prefix
        if token:
            try:
                after = base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
            except (ValueError, UnicodeDecodeError):
                raise InvalidArgument("page_token: not a token this server issued") from None
            if not after or not after.startswith(prefix):
                raise InvalidArgument("page_token: not a token for this listing")
        i = bisect.bisect_right(self.names, after)
        out: list[str] = []
        while i < len(self.names) and len(out) < size and self.names[i].startswith(prefix):
            out.append(self.names[i])
            i += 1
        more = i < len(self.names) and self.names[i].startswith(prefix)
        next_token = base64.urlsafe_b64encode(out[-1].encode()).decode() if more and out else ""
        return out, next_token


def check_mask(mask: Any, allowed: frozenset[str], kind: str) -> list[str]:
    """The mask's paths, each naming an updatable field of ``kind``; INVALID_ARGUMENT if not."""
    paths = list(mask.paths)
    if not paths:
        raise InvalidArgument("update_mask: must name at least one field to update")
    for p in paths:
        if p.split(".")[0] not in allowed:
            raise InvalidArgument(f"update_mask: {p!r} is not a known updatable {kind} field")
    return paths


def apply_mask(paths: list[str], source: Any, destination: Any) -> None:
    """Copy the masked fields; a masked field unset in ``source`` is cleared (Google's rule)."""
    mask = pb.FieldMask(paths=paths)
    try:
        mask.MergeMessage(
            source, destination, replace_message_field=True, replace_repeated_field=True
        )
    except ValueError as e:
        raise InvalidArgument(f"update_mask: {e}") from None
