"""What the record batches of an Arrow IPC stream declare, read without decoding a batch.

Why the harness reads them itself: a ``save_to_disk`` shard is an Arrow IPC stream, read from
a memory map. An uncompressed batch costs nothing to open (its buffers are slices of the map,
bounded by the file's size, which the data bounds check first), but a batch written with body
compression (LZ4 or ZSTD) is decompressed into buffers allocated at the sizes the batch itself
declares, before any caller sees a row: a few kilobytes of ZSTD can declare gigabytes of
offsets. Reading the declarations first bounds rows and decompressed bytes before Arrow
allocates anything.

The layout is apache/arrow's ``format/Message.fbs`` and ``format/Schema.fbs`` (FlatBuffers):
a ``Message`` table holds ``header_type`` (field 1: 1 Schema, 2 DictionaryBatch, 3
RecordBatch) and ``header`` (field 2); a ``RecordBatch`` table holds ``length`` (field 0, rows),
``buffers`` (field 2, a vector of ``{offset: int64, length: int64}`` structs into the message
body) and ``compression`` (field 3, absent when the body is not compressed); a
``DictionaryBatch`` holds its values as a ``RecordBatch`` in field 1. With compression, each
buffer in the body starts with its decompressed length as a little-endian int64 (-1: stored
uncompressed), per the ``BodyCompression`` comments in ``Message.fbs``. FlatBuffers' own layout
(google/flatbuffers ``docs/source/internals.md``): a table starts with an int32 offset back to
its vtable; the vtable lists each field's offset in the table as a uint16 (0: absent); offsets
to tables and vectors are uint32 relative to where they are stored; a vector is a uint32 count
followed by its elements.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

SCHEMA, DICTIONARY_BATCH, RECORD_BATCH = 1, 2, 3


class BadMessage(ValueError):
    """Message metadata that is not an Arrow IPC message (cut short, or offsets out of range)."""


@dataclass(frozen=True)
class Declared:
    kind: int  # SCHEMA, DICTIONARY_BATCH, RECORD_BATCH, or another header type
    rows: int  # a record batch's rows (0 for anything else)
    decompressed: int  # bytes Arrow allocates to decompress the body (0 when not compressed)


class _Buf:
    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data

    def read(self, fmt: str, pos: int) -> int:
        size = struct.calcsize(fmt)
        if pos < 0 or pos + size > len(self.data):
            raise BadMessage("cut short")
        return int(struct.unpack_from(fmt, self.data, pos)[0])

    def table(self, pos: int) -> _Table:
        return _Table(self, pos)


class _Table:
    def __init__(self, buf: _Buf, pos: int) -> None:
        self.buf, self.pos = buf, pos
        self.vtable = pos - buf.read("<i", pos)
        self.vsize = buf.read("<H", self.vtable)

    def field(self, index: int) -> int | None:
        """Where field ``index`` is stored, or None when the table does not hold it."""
        slot = 4 + 2 * index
        if slot + 2 > self.vsize:
            return None
        off = self.buf.read("<H", self.vtable + slot)
        return None if off == 0 else self.pos + off

    def scalar(self, index: int, fmt: str, default: int = 0) -> int:
        at = self.field(index)
        return default if at is None else self.buf.read(fmt, at)

    def ref(self, index: int) -> int | None:
        """The position an offset field (a table or a vector) points to."""
        at = self.field(index)
        return None if at is None else at + self.buf.read("<I", at)


def _batch(buf: _Buf, table: _Table, body: bytes | memoryview) -> tuple[int, int]:
    """(rows, decompressed bytes) a ``RecordBatch`` table declares."""
    rows = table.scalar(0, "<q")
    if rows < 0:
        raise BadMessage(f"a negative row count ({rows})")
    if table.field(3) is None:  # no BodyCompression: buffers are slices of the body
        return rows, 0
    vec = table.ref(2)
    if vec is None:
        return rows, 0
    count = buf.read("<I", vec)
    total = 0
    for i in range(count):
        offset = buf.read("<q", vec + 4 + 16 * i)
        length = buf.read("<q", vec + 4 + 16 * i + 8)
        if length == 0:
            continue
        if offset < 0 or length < 8 or offset + 8 > len(body):
            raise BadMessage("a compressed buffer outside the message body")
        size = struct.unpack_from("<q", body, offset)[0]
        if size < -1:
            raise BadMessage(f"a negative decompressed size ({size})")
        total += length - 8 if size == -1 else size
    return rows, total


def declared(metadata: bytes | memoryview, body: bytes | memoryview) -> Declared:
    """What one IPC message's metadata declares (``body``: its body, for compressed sizes; a
    memoryview of a memory-mapped body is read without copying it)."""
    buf = _Buf(metadata)
    message = buf.table(buf.read("<I", 0))
    kind = message.scalar(1, "<B")
    header = message.ref(2)
    if header is None or kind not in (DICTIONARY_BATCH, RECORD_BATCH):
        return Declared(kind, 0, 0)
    table = buf.table(header)
    if kind == DICTIONARY_BATCH:
        data = table.ref(1)
        if data is None:
            return Declared(kind, 0, 0)
        _, decompressed = _batch(buf, buf.table(data), body)
        return Declared(kind, 0, decompressed)
    rows, decompressed = _batch(buf, table, body)
    return Declared(kind, rows, decompressed)
