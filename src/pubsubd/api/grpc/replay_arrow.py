"""The replay API's ``Read`` answered as Arrow (``ReadRequest.arrow``): one page -> the bytes of
an Arrow IPC stream holding one record batch (``ReadResponse.arrow_ipc``).

The Spark connector's Python worker turns those bytes into a RecordBatch without touching a
row (``pyarrow.ipc.open_stream(buf).read_next_batch()`` maps the buffers), where the columnar
protobuf form costs it a parse and a conversion per page. pyarrow and numpy are optional on the
server (``pip install pubsubd[arrow]``): without them :data:`AVAILABLE` is False and ``Read``
answers in the form the request's other fields ask for, which every reader falls back to.

The page is built per log entry, not per row: offsets, publish times and ordering keys are runs
(one per entry) expanded by numpy; per row only ``data`` is gathered into a list for pyarrow
(and, for an entry whose messages carry attributes, the attribute maps).
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any

from pubsubd.core.wire import varint

try:
    import numpy as np
    import pyarrow as pa
except ImportError:  # the server runs without pyarrow: Read answers in protobuf only
    np = pa = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from pubsubd.api.grpc.replay import Page

AVAILABLE = pa is not None and np is not None

_data = attrgetter("data")
_attributes = attrgetter("attributes")


def page_schema() -> Any:
    """The page batch's Arrow schema (pyarrow must be installed); only ``ordering_key`` has
    nulls (unkeyed messages)."""
    return pa.schema(
        [
            ("offset", pa.int64()),
            ("data", pa.binary()),
            ("ordering_key", pa.string()),
            ("publish_time", pa.timestamp("us", tz="UTC")),
            ("attributes", pa.map_(pa.string(), pa.string())),
        ]
    )


_SCHEMA: Any = page_schema() if AVAILABLE else None


def page_batch(rows: Page) -> Any:
    """The page's rows (``replay._page``) as a RecordBatch with :func:`page_schema`."""
    runs = len(rows)
    lengths = np.fromiter((hi - lo for _, lo, hi in rows), np.int64, runs)
    starts = np.fromiter((d.entry.base_offset + lo for d, lo, _ in rows), np.int64, runs)
    times = np.fromiter((d.entry.publish_time_us for d, _, _ in rows), np.int64, runs)
    n = int(lengths.sum())
    # Row i of a run starting at offset s, after c rows of earlier runs: offset s - c + i.
    before = np.cumsum(lengths) - lengths
    offsets = np.arange(n, dtype=np.int64) + np.repeat(starts - before, lengths)
    keys = [d.ordering_key or None for d, _, _ in rows]
    if any(keys):
        ordering = pa.array(np.repeat(np.array(keys, dtype=object), lengths), pa.string())
    else:
        ordering = pa.nulls(n, pa.string())
    data: list[bytes] = []
    counts: list[int] | None = None  # attributes per row, once an entry has any
    attr_keys: list[str] = []
    attr_values: list[str] = []
    for decoded, lo, hi in rows:
        plain = decoded.plain_data()
        if plain is not None:  # no attributes: no parsed message touched
            data.extend(plain[lo:hi])
            if counts is not None:
                counts.extend([0] * (hi - lo))
            continue
        if counts is None:
            counts = [0] * len(data)
        parsed = decoded.parsed[lo:hi]
        data.extend(map(_data, parsed))
        maps = list(map(_attributes, parsed))
        counts.extend(map(len, maps))
        for attrs in maps:
            for key in attrs:  # faster than .items() on a upb map
                attr_keys.append(key)
                attr_values.append(attrs[key])
    map_offsets = np.zeros(n + 1, dtype=np.int32)
    if counts is not None:
        np.cumsum(np.asarray(counts, dtype=np.int32), out=map_offsets[1:])
    attributes = pa.MapArray.from_arrays(
        pa.array(map_offsets),
        pa.array(attr_keys, pa.string()),
        pa.array(attr_values, pa.string()),
    )
    columns = [
        pa.array(offsets),
        pa.array(data, pa.binary()),
        ordering,
        pa.array(np.repeat(times, lengths), _SCHEMA.field("publish_time").type),
        attributes,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_SCHEMA)


def batch_ipc(batch: Any) -> bytes:
    """The bytes of ``ReadResponse.arrow_ipc`` for a page batch: an IPC stream of one batch."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, _SCHEMA) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


def page_ipc(rows: Page) -> bytes:
    """``ReadResponse.arrow_ipc`` for the page's rows."""
    return batch_ipc(page_batch(rows))


def read_response(next_offset: int, ipc: bytes) -> bytes:
    """The serialized ``ReadResponse`` of an Arrow page, framed by hand: the page's bytes are
    copied once (setting the protobuf field and serializing the message copies them twice, and
    cost ~0.3 µs per 100-byte row)."""
    return b"".join((b"\x10", varint(next_offset), b"\x22", varint(len(ipc)), ipc))
