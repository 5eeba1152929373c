r"""Subscription filters: Google's filter language over message attributes (pure).

``parse(text)`` checks a subscription's ``filter`` once and compiles it to nested closures;
``Filter.matches(attributes)`` then runs for every message the subscription would deliver. Messages
that do not match are acknowledged by the server without being delivered (docs/GOOGLE_API.md
§4, §7.7; https://cloud.google.com/pubsub/docs/subscription-message-filter).

Grammar (whitespace may separate any two tokens)::

    filter     = [ expression ]              empty or blank text: every message matches
    expression = term { "AND" term }         one operator per level: AND and OR are never
               | term { "OR" term }          mixed without parentheses (Google rejects that)
    term       = { "NOT" | "-" } primary     NOT (or unary minus) binds tightest
    primary    = "(" expression ")"
               | "attributes" ":" key                             the key is present
               | "attributes" "." key ( "=" | "!=" ) string       the value is / is not
               | "hasPrefix" "(" "attributes" "." key "," string ")"
    key        = name | string
    name       = [A-Za-z0-9_] { [A-Za-z0-9_-] }    other keys are written as string literals
    string     = '"' { char | escape } '"'         single quotes work too (AIP-160 lexing)
    escape     = \\ \" \' \` \? \a \b \f \n \r \t \v | \xHH | \uHHHH | \UHHHHHHHH | \ooo (octal)

``AND``, ``OR``, ``NOT`` and ``hasPrefix`` are case-sensitive; keys and values match exactly.

Semantics, as Google documents them (and as its Go fake ``pstest`` implements them):

* ``attributes:k``                  k is present
* ``attributes.k = "v"``            k is present and its value is exactly v
* ``attributes.k != "v"``           NOT (attributes.k = "v"): **true when k is missing**
  (Google: "Messages without the name attribute and the value of com")
* ``hasPrefix(attributes.k, "p")``  k is present and its value starts with p

Errors raise ``InvalidArgument`` naming the problem and the 0-based character position in the
filter text, e.g. ``filter: unexpected token ')' at position 17``. The 256-byte limit is checked
by ``core/validation.py``; parentheses nest at most ``MAX_DEPTH`` deep.
"""

from __future__ import annotations

import string as _string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

from pubsubd.core.errors import InvalidArgument

MAX_DEPTH = 100  # nested parentheses; Google's 256-byte limit allows about 128

Matcher: TypeAlias = Callable[[Mapping[str, str]], bool]


# --- syntax tree ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Has:
    key: str


@dataclass(frozen=True, slots=True)
class Equals:
    key: str
    value: str


@dataclass(frozen=True, slots=True)
class NotEquals:
    key: str
    value: str


@dataclass(frozen=True, slots=True)
class HasPrefix:
    key: str
    prefix: str


@dataclass(frozen=True, slots=True)
class Not:
    operand: Expr


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Expr, ...]


Expr: TypeAlias = Has | Equals | NotEquals | HasPrefix | Not | And | Or


class Filter:
    """A parsed filter. ``matches(attributes)`` is a plain closure: call it per message."""

    __slots__ = ("expr", "matches", "text")

    text: str
    expr: Expr | None  # None: the filter is empty and matches everything
    matches: Matcher

    def __init__(self, text: str, expr: Expr | None) -> None:
        self.text = text
        self.expr = expr
        self.matches = _match_all if expr is None else _compile(expr)

    @property
    def match_all(self) -> bool:
        return self.expr is None

    def __str__(self) -> str:
        """The canonical text of the filter (parses back to the same tree)."""
        return "" if self.expr is None else to_text(self.expr)

    def __repr__(self) -> str:
        return f"Filter({self.text!r})"


def parse(text: str) -> Filter:
    """Parse and compile ``text``; raise InvalidArgument naming the problem and its position."""
    tokens = _tokenize(text)
    if tokens[0].kind == _END:
        return Filter(text, None)
    parser = _Parser(tokens)
    expr = parser.expression(0)
    tok = parser.peek()
    if tok.kind != _END:
        raise _unexpected(tok, _after_term_hint(tok))
    return Filter(text, expr)


# --- lexer ------------------------------------------------------------------------------------

_END, _WORD, _STRING = "end", "word", "string"
_WHITESPACE = frozenset(" \t\r\n\f\v")
_NAME_START = frozenset(_string.ascii_letters + _string.digits + "_")
_NAME_CHARS = _NAME_START | {"-"}
_PUNCTUATION = frozenset("(),.:=-")
_SIMPLE_ESCAPES = {
    "\\": "\\",
    '"': '"',
    "'": "'",
    "`": "`",
    "?": "?",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
}
_HEX_ESCAPES = {"x": 2, "X": 2, "u": 4, "U": 8}
_HEX = frozenset(_string.hexdigits)
_OCTAL = frozenset(_string.octdigits)


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # _END, _WORD, _STRING, or the punctuation itself: ( ) , . : = != -
    text: str  # as written
    value: str  # the word, or the decoded string
    pos: int


def _error(problem: str, pos: int) -> InvalidArgument:
    return InvalidArgument(f"filter: {problem} at position {pos}")


def _describe(tok: _Token) -> str:
    if tok.kind == _END:
        return "end of filter"
    shown = tok.text if len(tok.text) <= 24 else tok.text[:20] + "..."
    if tok.kind == _STRING:
        return f"string {shown}"
    return f"token {shown!r}" if "'" not in shown else f'token "{shown}"'


def _unexpected(tok: _Token, expected: str) -> InvalidArgument:
    return InvalidArgument(
        f"filter: unexpected {_describe(tok)} at position {tok.pos}; expected {expected}"
    )


def _tokenize(text: str) -> list[_Token]:
    out: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _WHITESPACE:
            i += 1
        elif c in _NAME_START:
            j = i + 1
            while j < n and text[j] in _NAME_CHARS:
                j += 1
            out.append(_Token(_WORD, text[i:j], text[i:j], i))
            i = j
        elif c == '"' or c == "'":
            value, j = _string_literal(text, i)
            out.append(_Token(_STRING, text[i:j], value, i))
            i = j
        elif c == "!" and text.startswith("!=", i):
            out.append(_Token("!=", "!=", "!=", i))
            i += 2
        elif c in _PUNCTUATION:
            out.append(_Token(c, c, c, i))
            i += 1
        else:
            shown = f"'{c}'" if c.isprintable() and c != "'" else repr(c)
            hint = "; did you mean '!='?" if c == "!" else ""
            raise InvalidArgument(f"filter: unexpected character {shown} at position {i}{hint}")
    out.append(_Token(_END, "", "", n))
    return out


def _string_literal(text: str, start: int) -> tuple[str, int]:
    """Decode the literal opening at ``start``; return its value and the index after it."""
    quote = text[start]
    parts: list[str] = []
    i, n = start + 1, len(text)
    while True:
        j = i
        while j < n and text[j] != quote and text[j] != "\\":
            j += 1
        parts.append(text[i:j])
        if j >= n:
            raise _error("unterminated string literal", start)
        if text[j] == quote:
            return "".join(parts), j + 1
        # A backslash escape.
        if j + 1 >= n:
            raise _error("unterminated string literal", start)
        e = text[j + 1]
        if e in _SIMPLE_ESCAPES:
            parts.append(_SIMPLE_ESCAPES[e])
            i = j + 2
        elif e in _HEX_ESCAPES:
            digits = text[j + 2 : j + 2 + _HEX_ESCAPES[e]]
            if len(digits) != _HEX_ESCAPES[e] or not all(d in _HEX for d in digits):
                raise _error(f"invalid escape sequence '\\{e}{digits}'", j)
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise _error(f"escape '\\{e}{digits}' is not a Unicode character", j)
            parts.append(chr(code))
            i = j + 2 + len(digits)
        elif e in "0123":
            digits = text[j + 1 : j + 4]
            if len(digits) != 3 or not all(d in _OCTAL for d in digits):
                raise _error(f"invalid escape sequence '\\{digits}'", j)
            parts.append(chr(int(digits, 8)))
            i = j + 4
        else:
            raise _error(f"invalid escape sequence '\\{e}'", j)


# --- parser -----------------------------------------------------------------------------------

_CONDITION = (
    'a condition (attributes:KEY, attributes.KEY = "VALUE", hasPrefix(attributes.KEY, "PREFIX")), '
    "NOT, '-' or '('"
)
_KEY = 'an attribute key (a name, or a string such as "my key")'
_VALUE = 'a string in double quotes such as "value"'


def _after_term_hint(tok: _Token) -> str:
    if tok.kind == _WORD and tok.value.upper() in ("AND", "OR", "NOT"):
        return "AND, OR or end of filter (operators are upper case)"
    return "AND, OR or end of filter"


class _Parser:
    __slots__ = ("i", "tokens")

    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.i = 0

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        tok = self.tokens[self.i]
        if tok.kind != _END:
            self.i += 1
        return tok

    def expect(self, kind: str, expected: str) -> _Token:
        tok = self.take()
        if tok.kind != kind:
            raise _unexpected(tok, expected)
        return tok

    def expression(self, depth: int) -> Expr:
        first = self.term(depth)
        tok = self.peek()
        if tok.kind != _WORD or tok.value not in ("AND", "OR"):
            return first
        op = tok.value
        operands = [first]
        while tok.kind == _WORD and tok.value in ("AND", "OR"):
            if tok.value != op:
                raise _error(
                    f"{tok.value} after {op} needs parentheses (AND and OR cannot be mixed "
                    f"without them): unexpected token {tok.value!r}",
                    tok.pos,
                )
            self.i += 1
            operands.append(self.term(depth))
            tok = self.peek()
        return And(tuple(operands)) if op == "AND" else Or(tuple(operands))

    def term(self, depth: int) -> Expr:
        negate = False
        tok = self.peek()
        while tok.kind == "-" or (tok.kind == _WORD and tok.value == "NOT"):
            negate = not negate
            self.i += 1
            tok = self.peek()
        expr = self.primary(depth)
        return Not(expr) if negate else expr

    def primary(self, depth: int) -> Expr:
        tok = self.take()
        if tok.kind == "(":
            if depth >= MAX_DEPTH:
                raise _error(f"parentheses nested more than {MAX_DEPTH} deep", tok.pos)
            expr = self.expression(depth + 1)
            closing = self.peek()
            if closing.kind != ")":
                hint = _after_term_hint(closing).replace("end of filter", "')'")
                raise _unexpected(closing, hint)
            self.i += 1
            return expr
        if tok.kind == _WORD and tok.value == "attributes":
            sep = self.take()
            if sep.kind == ":":
                return Has(self.key())
            if sep.kind == ".":
                key = self.key()
                op = self.take()
                if op.kind not in ("=", "!="):
                    raise _unexpected(op, f"'=' or '!=' after attributes.{_key_text(key)}")
                value = self.expect(_STRING, _VALUE).value
                return Equals(key, value) if op.kind == "=" else NotEquals(key, value)
            raise _unexpected(sep, "':' or '.' after attributes")
        if tok.kind == _WORD and tok.value == "hasPrefix":
            self.expect("(", "'(' after hasPrefix")
            arg = self.take()
            if arg.kind != _WORD or arg.value != "attributes":
                raise _unexpected(arg, "attributes.KEY as the first argument of hasPrefix")
            self.expect(".", "'.' after attributes")
            key = self.key()
            self.expect(",", "',' after the key in hasPrefix")
            prefix = self.expect(_STRING, _VALUE).value
            self.expect(")", "')' closing hasPrefix")
            return HasPrefix(key, prefix)
        if tok.kind == _WORD and tok.value.lower() in ("attributes", "hasprefix", "not"):
            raise _unexpected(tok, f"{_CONDITION}; names are case-sensitive")
        raise _unexpected(tok, _CONDITION)

    def key(self) -> str:
        tok = self.take()
        if tok.kind not in (_WORD, _STRING):
            raise _unexpected(tok, _KEY)
        return tok.value


# --- evaluation -------------------------------------------------------------------------------


def _match_all(attributes: Mapping[str, str]) -> bool:
    return True


def _flatten(expr: And | Or) -> list[Expr]:
    """Operands of nested chains of the same operator, as one list (iteratively)."""
    kind = type(expr)
    out: list[Expr] = []
    stack: list[Expr] = list(reversed(expr.operands))
    while stack:
        e = stack.pop()
        if isinstance(e, kind):
            stack.extend(reversed(e.operands))
        else:
            out.append(e)
    return out


def _compile(expr: Expr) -> Matcher:
    """Nested closures; leaves (and NOT of a leaf) are single dictionary probes."""
    if isinstance(expr, Has):
        key = expr.key
        return lambda a: key in a
    if isinstance(expr, Equals):
        key, value = expr.key, expr.value
        return lambda a: a.get(key) == value
    if isinstance(expr, NotEquals):
        key, value = expr.key, expr.value
        return lambda a: a.get(key) != value
    if isinstance(expr, HasPrefix):
        key, prefix = expr.key, expr.prefix

        def has_prefix(a: Mapping[str, str]) -> bool:
            v = a.get(key)
            return v is not None and v.startswith(prefix)

        return has_prefix
    if isinstance(expr, Not):
        inner = expr.operand
        if isinstance(inner, Has):
            key = inner.key
            return lambda a: key not in a
        if isinstance(inner, Equals):
            return _compile(NotEquals(inner.key, inner.value))
        if isinstance(inner, NotEquals):
            return _compile(Equals(inner.key, inner.value))
        if isinstance(inner, Not):
            return _compile(inner.operand)
        f = _compile(inner)
        return lambda a: not f(a)
    fs = tuple(_compile(e) for e in _flatten(expr))
    if isinstance(expr, And):
        if len(fs) == 2:
            f0, f1 = fs
            return lambda a: f0(a) and f1(a)

        def all_of(a: Mapping[str, str]) -> bool:
            for f in fs:  # noqa: SIM110 (a loop is cheaper than all() over a generator)
                if not f(a):
                    return False
            return True

        return all_of
    if len(fs) == 2:
        f0, f1 = fs
        return lambda a: f0(a) or f1(a)

    def any_of(a: Mapping[str, str]) -> bool:
        for f in fs:  # noqa: SIM110 (a loop is cheaper than any() over a generator)
            if f(a):
                return True
        return False

    return any_of


# --- printing ---------------------------------------------------------------------------------


def _is_name(key: str) -> bool:
    return bool(key) and key[0] in _NAME_START and all(c in _NAME_CHARS for c in key)


def quote(value: str) -> str:
    """``value`` as a double-quoted string literal of the filter language."""
    out = ['"']
    for c in value:
        if c == '"' or c == "\\":
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        elif ord(c) < 0x100:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    out.append('"')
    return "".join(out)


def _key_text(key: str) -> str:
    return key if _is_name(key) else quote(key)


def to_text(expr: Expr) -> str:
    """Canonical text of ``expr``: ``parse(to_text(e)).expr == e`` for trees ``parse`` makes."""
    if isinstance(expr, Has):
        return f"attributes:{_key_text(expr.key)}"
    if isinstance(expr, Equals):
        return f"attributes.{_key_text(expr.key)} = {quote(expr.value)}"
    if isinstance(expr, NotEquals):
        return f"attributes.{_key_text(expr.key)} != {quote(expr.value)}"
    if isinstance(expr, HasPrefix):
        return f"hasPrefix(attributes.{_key_text(expr.key)}, {quote(expr.prefix)})"
    if isinstance(expr, Not):
        inner = to_text(expr.operand)
        return f"NOT ({inner})" if isinstance(expr.operand, And | Or | Not) else f"NOT {inner}"
    op = " AND " if isinstance(expr, And) else " OR "
    return op.join(
        f"({to_text(e)})" if isinstance(e, And | Or) else to_text(e) for e in expr.operands
    )
