"""Property tests: random filter trees, printed to text in random legal spellings, parse back to
filters that select exactly the messages a naive reference evaluator selects."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubd.core import filters
from pubsubd.core.errors import InvalidArgument

pytestmark = pytest.mark.property

# A small key/value universe so generated filters and attribute dicts actually meet; plus keys that
# need quoting and values that need escapes.
KEYS = ["a", "b", "ce-type", "_x9", "AND", "my key", "a.b", 'q"k', "\u307f\u3093\u306a", "t\\ab"]
VALUES = ["", "v", "va", "val", "V", 'say "hi"', "back\\slash", "tab\there", "\x00", "\U0001f600"]

Tree = tuple[Any, ...]  # ("has", k) ("eq", k, v) ("ne", k, v) ("prefix", k, p) ("not", t)
# ("and", [t...]) ("or", [t...])

leaves = st.one_of(
    st.builds(lambda k: ("has", k), st.sampled_from(KEYS)),
    st.builds(lambda k, v: ("eq", k, v), st.sampled_from(KEYS), st.sampled_from(VALUES)),
    st.builds(lambda k, v: ("ne", k, v), st.sampled_from(KEYS), st.sampled_from(VALUES)),
    st.builds(lambda k, v: ("prefix", k, v), st.sampled_from(KEYS), st.sampled_from(VALUES)),
)
trees = st.recursive(
    leaves,
    lambda sub: st.one_of(
        st.builds(lambda t: ("not", t), sub),
        st.builds(lambda ts: ("and", ts), st.lists(sub, min_size=2, max_size=4)),
        st.builds(lambda ts: ("or", ts), st.lists(sub, min_size=2, max_size=4)),
    ),
    max_leaves=12,
)
attribute_dicts = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=6)


def evaluate(t: Tree, attrs: dict[str, str]) -> bool:
    """The reference semantics, written as plainly as possible."""
    kind = t[0]
    if kind == "has":
        return t[1] in attrs
    if kind == "eq":
        return t[1] in attrs and attrs[t[1]] == t[2]
    if kind == "ne":
        return not (t[1] in attrs and attrs[t[1]] == t[2])
    if kind == "prefix":
        return t[1] in attrs and attrs[t[1]].startswith(t[2])
    if kind == "not":
        return not evaluate(t[1], attrs)
    if kind == "and":
        return all(evaluate(x, attrs) for x in t[1])
    return any(evaluate(x, attrs) for x in t[1])


class Printer:
    """Prints a tree as filter text, drawing every free choice (spacing, quotes, NOT or -,
    escapes, redundant parentheses) from hypothesis."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw

    def ws(self, required: bool = False) -> str:
        s = self.draw(st.sampled_from(["", " ", "  ", "\t", "\n"]))
        return s or (" " if required else "")

    def string(self, value: str) -> str:
        quote = self.draw(st.sampled_from(['"', "'"]))
        out = [quote]
        for c in value:
            if c in (quote, "\\"):
                out.append("\\" + c)
            elif not c.isprintable() or self.draw(st.integers(0, 9)) == 0:
                form = self.draw(st.sampled_from(["u", "U", "x"] if ord(c) < 0x100 else ["u", "U"]))
                if ord(c) > 0xFFFF:
                    form = "U"
                width = {"x": 2, "u": 4, "U": 8}[form]
                digits = f"{ord(c):0{width}x}"
                out.append(f"\\{form}{digits.upper() if self.draw(st.booleans()) else digits}")
            else:
                out.append(c)
        out.append(quote)
        return "".join(out)

    def key(self, key: str) -> str:
        bare = key.replace("-", "").replace("_", "").isalnum() and key.isascii()
        return key if bare and self.draw(st.booleans()) else self.string(key)

    def text(self, t: Tree, top: bool = False) -> str:
        kind = t[0]
        w = self.ws
        if kind == "has":
            body = f"attributes{w()}:{w()}{self.key(t[1])}"
        elif kind in ("eq", "ne"):
            op = "=" if kind == "eq" else "!="
            body = f"attributes{w()}.{w()}{self.key(t[1])}{w()}{op}{w()}{self.string(t[2])}"
        elif kind == "prefix":
            body = (
                f"hasPrefix{w()}({w()}attributes.{self.key(t[1])}{w()},{w()}"
                f"{self.string(t[2])}{w()})"
            )
        elif kind == "not":
            operand = self.text(t[1])
            if self.draw(st.booleans()):
                body = f"NOT{w(required=True)}{operand}"
            else:
                body = f"-{w()}{operand}"
        else:
            op = " AND " if kind == "and" else " OR "
            body = op.join(self.text(x) for x in t[1])
            # A chain must be parenthesised unless it is the whole filter.
            if not top or self.draw(st.booleans()):
                return f"({w()}{body}{w()})"
            return body
        if self.draw(st.integers(0, 4)) == 0:
            return f"({w()}{body}{w()})"  # redundant parentheses are harmless
        return body


@st.composite
def printed(draw: Any) -> tuple[Tree, str]:
    t = draw(trees)
    return t, Printer(draw).text(t, top=True)


@settings(max_examples=400, deadline=None)
@given(printed(), st.lists(attribute_dicts, min_size=1, max_size=8))
def test_printed_trees_parse_back_to_equivalent_filters(
    case: tuple[Tree, str], samples: list[dict[str, str]]
) -> None:
    tree, text = case
    f = filters.parse(text)
    for attrs in samples:
        assert f.matches(attrs) == evaluate(tree, attrs), (text, attrs)
    # The canonical text is a fixed point and selects the same messages.
    canonical = filters.parse(str(f))
    assert canonical.expr == f.expr
    assert str(canonical) == str(f)
    for attrs in samples:
        assert canonical.matches(attrs) == f.matches(attrs)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_text_parses_or_fails_cleanly(text: str) -> None:
    """Any string either parses or raises InvalidArgument with a position inside the text."""
    try:
        filters.parse(text)
    except InvalidArgument as e:
        message = str(e)
        assert message.startswith("filter: ")
        pos = int(message.split("at position ")[1].split(";")[0].split(" ")[0])
        assert 0 <= pos <= len(text)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "attributes",
                ".",
                ":",
                "a",
                '"v"',
                "=",
                "!=",
                "(",
                ")",
                ",",
                "AND",
                "OR",
                "NOT",
                "-",
                "hasPrefix",
                " ",
            ]
        ),
        max_size=14,
    )
)
def test_token_soup_parses_or_fails_cleanly(tokens: list[str]) -> None:
    text = " ".join(tokens)
    try:
        f = filters.parse(text)
    except InvalidArgument as e:
        assert "at position" in str(e)
    else:
        assert filters.parse(str(f)).expr == f.expr
