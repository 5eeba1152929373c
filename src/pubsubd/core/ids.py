"""Positions, message IDs and ack IDs: how a message's place in a publish message source is named.

A *position* is (source, offset): the offset of a message in the log of one publish message source
of a topic. It packs into one int, ``source << 48 | offset``, used as a dict key on hot paths and,
in decimal, as the message ID (so the message IDs of source 0 are plain offsets, as numeric as
Google's). An *ack ID* names one delivery (lease) of a position to one subscription:
``{subscription incarnation}-{source}-{offset}-{lease generation}``; the incarnation keeps ack IDs
of a deleted subscription from acking in a new one of the same name.
"""

from __future__ import annotations

import functools
import re

from pubsubd.core.errors import InvalidAckId

OFFSET_BITS = 48
OFFSET_MASK = (1 << OFFSET_BITS) - 1
# Canonical numbers only (ASCII digits, no leading zeros): one string per delivery.
_ACK_ID = re.compile(r"([^-]+)-(0|[1-9][0-9]*)-(0|[1-9][0-9]*)-(0|[1-9][0-9]*)", re.ASCII)
# Ack IDs are short strings; anything longer than this is garbage, not an ack ID.
MAX_ACK_ID_LEN = 128


def position(source: int, offset: int) -> int:
    return (source << OFFSET_BITS) | offset


def source_of(pos: int) -> int:
    return pos >> OFFSET_BITS


def offset_of(pos: int) -> int:
    return pos & OFFSET_MASK


def message_id(source: int, offset: int) -> str:
    return str(position(source, offset))


def encode_ack_id(incarnation: str, pos: int, generation: int) -> str:
    return f"{incarnation}-{pos >> OFFSET_BITS}-{pos & OFFSET_MASK}-{generation}"


def decode_ack_id(ack_id: str, incarnation: str) -> tuple[int, int]:
    """Return (position, generation); raise InvalidAckId if malformed or of another incarnation."""
    found = _split_ack_id(ack_id, incarnation)
    if found is not None:
        return found
    if len(ack_id) > MAX_ACK_ID_LEN:
        raise InvalidAckId(ack_id[:32] + "...")
    raise InvalidAckId(ack_id)


def decode_ack_ids(ack_ids: list[str], incarnation: str) -> list[tuple[int, int]]:
    """:func:`decode_ack_id` of each, in order; raises for the first bad one as it would.

    A request's ack IDs are checked together: joined by newlines (which no ack ID holds), one
    regex match checks them all and the numbers are converted in bulk, ~0.3 µs per ID against
    ~1.3 one by one. Any doubt (a bad ID among them) goes one by one, for the same error."""
    if ack_ids and "-" not in incarnation and "\n" not in incarnation:
        joined = "\n".join(ack_ids)
        if (
            max(map(len, ack_ids)) <= MAX_ACK_ID_LEN
            and joined.count("\n") == len(ack_ids) - 1
            and _batch_pattern(incarnation).fullmatch(joined) is not None
        ):
            parts = joined.replace("\n", "-").split("-")  # incarnation, source, offset, gen, ...
            offsets = list(map(int, parts[2::4]))
            if max(offsets) <= OFFSET_MASK:
                sources = list(map(int, parts[1::4]))
                positions = (
                    [(s << OFFSET_BITS) | o for s, o in zip(sources, offsets, strict=True)]
                    if any(sources)
                    else offsets
                )
                return list(zip(positions, map(int, parts[3::4]), strict=True))
    split = _split_ack_id
    out = []
    for ack_id in ack_ids:
        found = split(ack_id, incarnation)
        if found is None:
            found = decode_ack_id(ack_id, incarnation)  # raises this ack ID's error
        out.append(found)
    return out


@functools.lru_cache(maxsize=1024)
def _batch_pattern(incarnation: str) -> re.Pattern[str]:
    """Ack IDs of ``incarnation`` joined by newlines (``_ACK_ID`` with the incarnation fixed)."""
    number = "(?:0|[1-9][0-9]*)"
    one = f"{re.escape(incarnation)}-{number}-{number}-{number}"
    return re.compile(f"{one}(?:\n{one})*", re.ASCII)


def _split_ack_id(ack_id: str, incarnation: str) -> tuple[int, int] | None:
    """(position, generation) of a well-formed ack ID of ``incarnation``, else None. Accepts
    exactly what ``_ACK_ID`` with ``incarnation`` as its first group accepts (tested), with
    ``str.split`` instead of the regex: a third of the time."""
    if len(ack_id) > MAX_ACK_ID_LEN:
        return None
    parts = ack_id.split("-")
    if len(parts) != 4 or parts[0] != incarnation:
        return None
    _, source, offset, generation = parts
    for number in (source, offset, generation):
        # ASCII digits, no leading zero ("0" itself is canonical)
        if not (number.isdigit() and number.isascii()) or (number[0] == "0" and len(number) > 1):
            return None
    off = int(offset)
    if off > OFFSET_MASK:
        return None
    return (int(source) << OFFSET_BITS) | off, int(generation)


def ack_id_source(ack_id: str) -> int | None:
    """The publish message source an ack ID's delivery came from, of any incarnation (None:
    not an ack ID). Frontends route an ack to the forwarder serving that source."""
    if len(ack_id) > MAX_ACK_ID_LEN:
        return None
    m = _ACK_ID.fullmatch(ack_id)
    return int(m.group(2)) if m is not None else None
