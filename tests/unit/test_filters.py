"""Unit tests for pubsubd.core.filters: Google's subscription filter language."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pubsubd.core import filters, pb, validation
from pubsubd.core.errors import InvalidArgument
from pubsubd.core.filters import And, Equals, Has, HasPrefix, Not, NotEquals, Or

pytestmark = pytest.mark.unit

# The message set of Google's own fake (google-cloud-go pubsub/pstest/filtering_test.go).
MESSAGES: dict[int, dict[str, str]] = {
    1: {"lang": "en", "name": "com", "timezone": "UTC"},
    2: {"lang": "en", "name": "net", "timezone": "UTC"},
    3: {"lang": "en", "name": "org", "timezone": "UTC"},
    4: {"lang": "cn", "name": "com", "timezone": "UTC"},
    5: {"lang": "cn", "name": "net", "timezone": "UTC"},
    6: {"lang": "cn", "name": "org", "timezone": "UTC"},
    7: {"lang": "jp", "name": "co", "timezone": "UTC"},
    8: {"lang": "jp", "timezone": "UTC"},
    9: {"name": "com", "timezone": "UTC"},
    10: {"lang": "jp", "\u307f\u3093\u306a": "dummy1"},
    11: {"\u307f\u3093\u306a": "dummy2"},
    12: {"name": "com", "\u307f\u3093\u306a": "dummy3"},
}


def selected(text: str) -> list[int]:
    f = filters.parse(text)
    return [i for i, attrs in MESSAGES.items() if f.matches(attrs)]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('attributes.name = "com"', [1, 4, 9, 12]),
        # != is NOT(=): messages without the key match too (Google's docs and pstest agree).
        ('attributes.name != "com"', [2, 3, 5, 6, 7, 8, 10, 11]),
        ('hasPrefix(attributes.name, "co")', [1, 4, 7, 9, 12]),
        ("attributes:name", [1, 2, 3, 4, 5, 6, 7, 9, 12]),
        ("NOT attributes:name", [8, 10, 11]),
        ('NOT hasPrefix(attributes.name, "co")', [2, 3, 5, 6, 8, 10, 11]),
        ('(NOT attributes:name) OR attributes.name = "co"', [7, 8, 10, 11]),
        ('NOT (attributes:name OR attributes.lang = "jp")', [11]),
        ('attributes.name = "com" AND -attributes:"lang"', [9, 12]),
        ('attributes:"\\u307F\\u3093\\u306A"', [10, 11, 12]),
        ('attributes."\\u307f\\u3093\\u306a" = "dummy2"', [11]),
        ('attributes.lang = "en" AND attributes.name != "com"', [2, 3]),
        (
            'attributes.lang = "jp" OR attributes.name = "net" OR attributes:"\u307f\u3093\u306a"',
            [2, 5, 7, 8, 10, 11, 12],
        ),
        ('attributes.lang = "cn" AND (attributes.name = "net" OR attributes.name = "org")', [5, 6]),
        (
            '(attributes.lang = "cn" AND attributes.name = "net") OR attributes.name = "org"',
            [3, 5, 6],
        ),
        ('NOT attributes.name = "com"', [2, 3, 5, 6, 7, 8, 10, 11]),  # NOT binds the comparison
        ("NOT NOT attributes:name", [1, 2, 3, 4, 5, 6, 7, 9, 12]),
        ("--attributes:name", [1, 2, 3, 4, 5, 6, 7, 9, 12]),
        ("- attributes:name", [8, 10, 11]),
        ("NOT -attributes:lang AND NOT attributes:name", [8, 10]),
        ('attributes.timezone = "utc"', []),  # values are case-sensitive
        ("attributes:Name", []),  # keys are case-sensitive
        ('hasPrefix(attributes.name, "")', [1, 2, 3, 4, 5, 6, 7, 9, 12]),  # present, any value
        ('attributes.name = ""', []),
        ('attributes.name != ""', list(MESSAGES)),
        ("((((attributes:lang))))", [1, 2, 3, 4, 5, 6, 7, 8, 10]),
    ],
)
def test_google_examples(text: str, want: list[int]) -> None:
    assert selected(text) == want


def test_spacing_and_quoting_are_free() -> None:
    compact = selected('attributes.name="com"AND(NOT attributes:lang)')
    assert compact == selected('attributes . name = "com" AND ( NOT attributes : lang )') == [9, 12]
    assert selected("attributes.name = 'com'") == selected('attributes."name" = "com"')
    assert selected("\n\tattributes:lang\n") == selected("attributes:lang")


def test_keys() -> None:
    attrs = {"ce-type": "x", "my key": "1", "a.b": "2", "AND": "3", "iana.org/language_tag": "en"}
    f = filters.parse
    assert f('attributes.ce-type = "x"').matches(attrs)  # hyphens need no quotes
    assert f('attributes."my key" = "1"').matches(attrs)
    assert f('attributes."a.b" = "2"').matches(attrs)
    assert f('attributes.AND = "3" AND attributes:NOT').matches({"AND": "3", "NOT": ""})
    assert f('attributes."iana.org/language_tag" = "en"').matches(attrs)
    assert f('attributes:"iana.org/language_tag" AND NOT attributes.name = "com"').matches(attrs)
    assert f("attributes:_1").matches({"_1": ""})
    assert f("attributes:9lives").matches({"9lives": ""})


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        (r'"a\"b"', 'a"b'),
        (r'"a\\b"', "a\\b"),
        (r"'it\'s'", "it's"),
        (r'"\a\b\f\n\r\t\v\?\`"', "\a\b\f\n\r\t\v?`"),
        (r'"\x41\X42"', "AB"),
        (r'"\101\102"', "AB"),
        (r'"\u00e9\U0001F600"', "\u00e9\U0001f600"),
        ('"raw é 😀"', "raw é 😀"),
        ('"it\'s"', "it's"),
        ("'say \"hi\"'", 'say "hi"'),
    ],
)
def test_string_escapes(literal: str, value: str) -> None:
    f = filters.parse(f"attributes.k = {literal}")
    assert f.expr == Equals("k", value)
    assert f.matches({"k": value})


def test_syntax_tree() -> None:
    assert filters.parse("attributes:a").expr == Has("a")
    assert filters.parse('hasPrefix(attributes."x y", "p")').expr == HasPrefix("x y", "p")
    assert filters.parse('attributes.a != "v"').expr == NotEquals("a", "v")
    assert filters.parse("NOT -NOT attributes:a").expr == Not(Has("a"))
    assert filters.parse("attributes:a AND attributes:b AND attributes:c").expr == And(
        (Has("a"), Has("b"), Has("c"))
    )
    assert filters.parse("attributes:a OR (attributes:b AND -attributes:c)").expr == Or(
        (Has("a"), And((Has("b"), Not(Has("c")))))
    )


def test_empty_filter_matches_everything() -> None:
    for text in ("", "   ", "\n"):
        f = filters.parse(text)
        assert f.match_all and f.expr is None and str(f) == ""
        assert f.matches({}) and f.matches({"a": "b"})
    assert not filters.parse("attributes:a").match_all


def test_canonical_text_round_trips() -> None:
    text = (
        'attributes:"iana.org/language_tag" AND (attributes.domain = "net" OR '
        'hasPrefix(attributes.domain, "co")) AND NOT hasPrefix(attributes.head, "foo")'
    )
    f = filters.parse(text)
    assert str(f) == text
    assert filters.parse(str(f)).expr == f.expr
    tricky = filters.parse('attributes."a \\"q\\" \\\\ \\n" = "\\x00\\u200b\\t"')
    assert filters.parse(str(tricky)).expr == tricky.expr == Equals('a "q" \\ \n', "\x00\u200b\t")


def test_works_on_protobuf_attribute_maps() -> None:
    """The dispatcher passes PubsubMessage.attributes; probing must not insert keys."""
    m = pb.PubsubMessage(attributes={"a": "x"})
    f = filters.parse('attributes.b = "" OR attributes.b != "y" OR hasPrefix(attributes.c, "")')
    assert f.matches(m.attributes)
    assert not filters.parse('attributes.b = ""').matches(m.attributes)
    assert dict(m.attributes) == {"a": "x"}


# --- errors ------------------------------------------------------------------------------------


def error(text: str) -> str:
    with pytest.raises(InvalidArgument) as e:
        filters.parse(text)
    message = str(e.value)
    assert message.startswith("filter: ")
    return message


def position(text: str) -> int:
    m = re.search(r"at position (\d+)", error(text))
    assert m is not None
    return int(m.group(1))


@pytest.mark.parametrize(
    ("text", "pos", "fragment"),
    [
        # Google's documented invalid examples.
        (
            'attributes:"iana.org/language_tag" AND attributes.name = "net" OR '
            'attributes.name = "org"',
            63,
            "OR after AND needs parentheses",
        ),
        ("attributes:a OR attributes:b AND attributes:c", 29, "AND after OR needs parentheses"),
        ('attributes.name = "com" AND ("net" OR "org")', 29, 'unexpected string "net"'),
        ('"com" = attributes.name', 0, 'unexpected string "com"'),
        ("attributes.name = attributes.website", 18, "unexpected token 'attributes'"),
        ("attributes:\\u307F\\u3093\\u306A", 11, "unexpected character '\\'"),
        # Structure.
        ('attributes.a = "x")', 18, "unexpected token ')'"),
        ("(attributes:a", 13, "unexpected end of filter"),
        ("()", 1, "unexpected token ')'"),
        ("attributes:a attributes:b", 13, "expected AND, OR or end of filter"),
        ("attributes:a AND", 16, "unexpected end of filter"),
        ("NOT", 3, "expected a condition"),
        ("-", 1, "expected a condition"),
        ("AND attributes:a", 0, "unexpected token 'AND'"),
        ("attributes", 10, "expected ':' or '.' after attributes"),
        ("attributes.a", 12, "expected '=' or '!='"),
        ("attributes.a = ", 15, "expected a string"),
        ('attributes.a == "x"', 14, "unexpected token '='"),
        ('attributes.a ! "x"', 13, "did you mean '!='?"),
        ('attributes.a = "x" attributes', 19, "unexpected token 'attributes'"),
        ("attributes:", 11, "expected an attribute key"),
        ('attributes."a"."b" = "c"', 14, "unexpected token '.'"),
        ('attributes.a.b = "c"', 12, "unexpected token '.'"),
        ('attributes:a = "x"', 13, "unexpected token '='"),
        ("attributes.a = x", 15, "unexpected token 'x'"),
        ("attributes.a = 5", 15, "unexpected token '5'"),
        ("foo", 0, "unexpected token 'foo'"),
        ('attributes.a = "x" # comment', 19, "unexpected character '#'"),
        # Case.
        ('attributes.a = "x" and attributes:b', 19, "operators are upper case"),
        ("not attributes:b", 0, "names are case-sensitive"),
        ("Attributes:b", 0, "names are case-sensitive"),
        ('hasprefix(attributes.a, "x")', 0, "names are case-sensitive"),
        # hasPrefix.
        ('hasPrefix attributes.a, "x")', 10, "expected '(' after hasPrefix"),
        ('hasPrefix("x", attributes.a)', 10, "attributes.KEY as the first argument"),
        ('hasPrefix(attributes.a "x")', 23, "expected ',' after the key"),
        ("hasPrefix(attributes.a, x)", 24, "expected a string"),
        ('hasPrefix(attributes.a, "x"', 27, "expected ')' closing hasPrefix"),
        ('hasPrefix(attributes:a, "x")', 20, "expected '.' after attributes"),
        # Strings.
        ('attributes.a = "abc', 15, "unterminated string literal"),
        ("attributes.a = 'abc\"", 15, "unterminated string literal"),
        ('attributes.a = "abc\\', 15, "unterminated string literal"),
        ('attributes.a = "a\\qb"', 17, "invalid escape sequence '\\q'"),
        ('attributes.a = "\\x4"', 16, "invalid escape sequence '\\x4\"'"),
        ('attributes.a = "\\u12G4"', 16, "invalid escape sequence"),
        ('attributes.a = "\\uD800"', 16, "not a Unicode character"),
        ('attributes.a = "\\U00110000"', 16, "not a Unicode character"),
        ('attributes.a = "\\18"', 16, "invalid escape sequence '\\18\"'"),
        ('attributes.a = "\\8"', 16, "invalid escape sequence '\\8'"),
    ],
)
def test_errors_name_problem_and_position(text: str, pos: int, fragment: str) -> None:
    message = error(text)
    assert fragment in message, message
    assert f"at position {pos}" in message, message


def test_error_message_format() -> None:
    assert error('attributes.a = "x")') == (
        "filter: unexpected token ')' at position 18; expected AND, OR or end of filter"
    )


def test_nesting_limit() -> None:
    deep = "(" * filters.MAX_DEPTH + "attributes:a" + ")" * filters.MAX_DEPTH
    assert filters.parse(deep).matches({"a": ""})
    too_deep = "(" + deep + ")"
    assert position(too_deep) == filters.MAX_DEPTH
    assert "nested more than" in error(too_deep)
    # Long NOT chains and long operator chains do not recurse.
    assert filters.parse("NOT " * 1001 + "attributes:a").matches({})
    chain = " AND ".join(f"attributes:k{i}" for i in range(2000))
    assert filters.parse(chain).matches({f"k{i}": "" for i in range(2000)})
    assert not filters.parse(chain).matches({f"k{i}": "" for i in range(1999)})


def test_long_error_tokens_are_shortened() -> None:
    message = error('"' + "x" * 200 + '" = attributes.a')
    assert len(message) < 300 and "..." in message


# --- wiring ------------------------------------------------------------------------------------


def subscription(**kw: Any) -> Any:
    return pb.Subscription(
        name="projects/p/subscriptions/sub1", topic="projects/p/topics/topic1", **kw
    )


def test_validation_parses_the_filter() -> None:
    validation.subscription(subscription(filter='attributes.a = "b"'))
    validation.subscription(subscription(filter=""))
    with pytest.raises(InvalidArgument, match=r"filter: unexpected token '\)' at position 18"):
        validation.subscription(subscription(filter='attributes.a = "b")'))
    with pytest.raises(InvalidArgument, match="filter: longer than 256 bytes"):
        validation.subscription(subscription(filter="attributes:" + "a" * 250))
