"""Paging of the dashboard's long lists (pure): ``/api/topics`` and ``/api/subscriptions``
answer one page of names at a time, in name order, so a process with thousands of topics
reads only the page's numbers.

A request (:class:`PageRequest`, from the query string) names a page size (default
:data:`DEFAULT_PAGE_SIZE`, at most :data:`MAX_PAGE_SIZE`), a page token and a substring the
names must contain (``filter=``). A page token is the last name of the page before,
base64url-encoded: opaque to callers, valid across restarts, and still meaningful when names
were added or deleted meanwhile (the page starts after that name). A :class:`Page` carries
the tokens of the next page (``""`` at the end) and of the previous one (``None`` on the first
page, ``""`` when the previous page is the first), the count of matching names and where the
page starts among them. A bad parameter raises ``ValueError`` (the endpoint's 400).
"""

from __future__ import annotations

import base64
import binascii
import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


@dataclass(frozen=True, slots=True)
class PageRequest:
    """Which page: ``size`` names after the name ``after`` (``""``: from the first) among
    those containing ``contains``."""

    size: int = DEFAULT_PAGE_SIZE
    after: str = ""
    contains: str = ""

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> PageRequest:
        """``page_size``, ``page_token`` and ``filter`` of a query string (absent or blank:
        the defaults); ``ValueError`` naming a bad one."""
        return cls(
            size=page_size(query.get("page_size", "")),
            after=decode_token(query.get("page_token", "")),
            contains=query.get("filter", ""),
        )


@dataclass(frozen=True, slots=True)
class Page:
    names: list[str]
    next_page_token: str  # "" at the end
    previous_page_token: str | None  # None on the first page, "" when that is the previous one
    total: int  # names containing the filter
    offset: int  # the index of the page's first name among them


def page_size(raw: str) -> int:
    """A ``page_size`` parameter: a whole number from 1 to MAX_PAGE_SIZE (blank: default)."""
    if raw == "":
        return DEFAULT_PAGE_SIZE
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PAGE_SIZE:
        raise ValueError(f"page_size: {raw!r} is not a whole number from 1 to {MAX_PAGE_SIZE}")
    return int(raw)


def encode_token(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode()


def decode_token(token: str) -> str:
    """The name a page token stands for (``""`` for no token)."""
    if token == "":
        return ""
    try:
        name = base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
    except (ValueError, binascii.Error, UnicodeError):
        raise ValueError("page_token: not a token this server issued") from None
    if not name:
        raise ValueError("page_token: not a token this server issued")
    return name


def page(names: Sequence[str], request: PageRequest) -> Page:
    """The page of ``names`` (sorted) that ``request`` asks for. O(log n) without a filter,
    O(n) with one (every name is tested)."""
    matching = names if not request.contains else [n for n in names if request.contains in n]
    start = bisect.bisect_right(matching, request.after) if request.after else 0
    chosen = list(matching[start : start + request.size])
    end = start + len(chosen)
    next_token = encode_token(chosen[-1]) if chosen and end < len(matching) else ""
    return Page(
        names=chosen,
        next_page_token=next_token,
        previous_page_token=_previous(matching, start, request.size),
        total=len(matching),
        offset=start,
    )


def _previous(matching: Sequence[str], start: int, size: int) -> str | None:
    """The token of the ``size`` names before ``start``: the name just before them, ``""``
    when they begin the list, None when nothing is before ``start``."""
    if start == 0:
        return None
    return encode_token(matching[start - size - 1]) if start > size else ""
