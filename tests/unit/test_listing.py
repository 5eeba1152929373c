"""Paging of the dashboard's lists (observability/listing.py): page sizes, tokens, filters,
the previous page, bad parameters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pubsubd.observability.listing import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    PageRequest,
    decode_token,
    encode_token,
    page,
)

pytestmark = pytest.mark.unit

NAMES = [f"projects/p/topics/t-{i:03d}" for i in range(250)]


def test_pages_follow_each_other_to_the_end() -> None:
    first = page(NAMES, PageRequest(size=100))
    assert first.names == NAMES[:100] and (first.offset, first.total) == (0, 250)
    assert first.previous_page_token is None
    second = page(NAMES, PageRequest(size=100, after=decode_token(first.next_page_token)))
    assert second.names == NAMES[100:200] and second.offset == 100
    assert second.previous_page_token == ""  # the previous page is the first
    third = page(NAMES, PageRequest(size=100, after=decode_token(second.next_page_token)))
    assert third.names == NAMES[200:] and third.next_page_token == ""
    assert decode_token(third.previous_page_token or "") == NAMES[99]  # the second page
    exact = page(NAMES[:100], PageRequest(size=100))
    assert exact.next_page_token == ""  # no empty page after a full last one


def test_a_filter_keeps_the_names_containing_it() -> None:
    request = PageRequest(size=4, contains="t-1")
    chosen = page(NAMES, request)
    assert chosen.names == NAMES[100:104] and chosen.total == 100
    later = page(NAMES, PageRequest(4, decode_token(chosen.next_page_token), "t-1"))
    assert later.names == NAMES[104:108] and later.offset == 4
    assert page(NAMES, PageRequest(contains="none")).names == []


def test_a_token_still_works_after_its_name_is_gone() -> None:
    token = page(NAMES, PageRequest(size=10)).next_page_token
    rest = [n for n in NAMES if n != NAMES[9]]  # the token's own name was deleted
    assert page(rest, PageRequest(size=10, after=decode_token(token))).names == NAMES[10:20]


def test_query_parameters() -> None:
    assert PageRequest.from_query({}) == PageRequest(DEFAULT_PAGE_SIZE, "", "")
    assert PageRequest.from_query({"page_size": "", "page_token": "", "filter": ""}) == (
        PageRequest()
    )
    token = encode_token("projects/p/topics/a+b/ü")
    assert PageRequest.from_query(
        {"page_size": str(MAX_PAGE_SIZE), "page_token": token, "filter": "x"}
    ) == PageRequest(MAX_PAGE_SIZE, "projects/p/topics/a+b/ü", "x")


@pytest.mark.parametrize("size", ["0", "1001", "-1", "+5", "1.0", "ten", "٣", " 5"])
def test_bad_page_sizes(size: str) -> None:
    with pytest.raises(ValueError, match=r"^page_size: "):
        PageRequest.from_query({"page_size": size})


@pytest.mark.parametrize("token", ["not*base64", "_w==", "abc", "===="])
def test_bad_page_tokens(token: str) -> None:
    with pytest.raises(ValueError, match=r"^page_token: "):
        PageRequest.from_query({"page_token": token})


@given(
    names=st.lists(st.text(min_size=1, max_size=6), unique=True, max_size=60),
    size=st.integers(1, 12),
    contains=st.sampled_from(["", "a", "b", "ab"]),
)
def test_following_next_tokens_lists_every_matching_name_once(
    names: list[str], size: int, contains: str
) -> None:
    names.sort()
    seen: list[str] = []
    after = ""
    previous_starts: list[int] = []
    while True:
        chosen = page(names, PageRequest(size, after, contains))
        assert chosen.offset == len(seen)
        previous_starts.append(chosen.offset)
        if chosen.previous_page_token is not None:  # it leads to the page before this one
            back = page(
                names, PageRequest(size, decode_token(chosen.previous_page_token), contains)
            )
            assert back.offset == previous_starts[-2]
        seen += chosen.names
        if not chosen.next_page_token:
            break
        assert len(chosen.names) == size
        after = decode_token(chosen.next_page_token)
    assert seen == [n for n in names if contains in n]
