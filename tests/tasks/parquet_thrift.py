"""A Thrift compact codec, enough to rewrite a Parquet footer and its page headers: the lying
and hostile Parquet files of the task-data tests are built with it (pyarrow writes a small honest
file; its footer and page headers are decoded, edited and written back).

A struct is {field id: (type, value)}; a list (type, [values]); a map (key type, value type,
[(key, value)]), or with a fourth item, the entry count the map declares (what a hostile header
claims, whatever entries follow).  Types as in the compact protocol (1 bool, 3 byte, 4-6 ints,
7 double, 8 binary, 9 list, 10 set, 11 map, 12 struct).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _varint(b: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        c = b[i]
        i += 1
        out |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return out, i


def _unvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read(b: bytes, i: int, t: int) -> tuple[Any, int]:
    if t in (1, 2):
        return t == 1, i
    if t == 3:
        return b[i], i + 1
    if t in (4, 5, 6):
        n, i = _varint(b, i)
        return (n >> 1) ^ -(n & 1), i
    if t == 7:
        return struct.unpack_from("<d", b, i)[0], i + 8
    if t == 8:
        n, i = _varint(b, i)
        return bytes(b[i : i + n]), i + n
    if t in (9, 10):
        head = b[i]
        i += 1
        n, et = head >> 4, head & 15
        if n == 15:
            n, i = _varint(b, i)
        items = []
        for _ in range(n):
            if et in (1, 2):
                items.append(b[i] == 1)
                i += 1
            else:
                v, i = _read(b, i, et)
                items.append(v)
        return (et, items), i
    if t == 11:
        n, i = _varint(b, i)
        if not n:
            return (0, 0, []), i
        kv = b[i]
        i += 1
        pairs = []
        for _ in range(n):
            k, i = _read(b, i, kv >> 4)
            v, i = _read(b, i, kv & 15)
            pairs.append((k, v))
        return (kv >> 4, kv & 15, pairs), i
    if t == 12:
        return read_struct(b, i)
    raise ValueError(f"type {t}")


def read_struct(b: bytes, i: int) -> tuple[dict[int, Any], int]:
    fields: dict[int, Any] = {}
    last = 0
    while True:
        head = b[i]
        i += 1
        if head == 0:
            return fields, i
        t, delta = head & 15, head >> 4
        if delta:
            fid = last + delta
        else:
            n, i = _varint(b, i)
            fid = (n >> 1) ^ -(n & 1)
        v, i = _read(b, i, t)
        fields[fid] = (1 if t in (1, 2) else t, v)
        last = fid


def _write(t: int, v: Any) -> bytes:
    if t == 3:
        return bytes([v & 0xFF])
    if t in (4, 5, 6):
        return _unvarint(((v << 1) ^ (v >> 63)) & (2**64 - 1))
    if t == 7:
        return struct.pack("<d", v)
    if t == 8:
        return _unvarint(len(v)) + v
    if t in (9, 10):
        et, items = v
        out = bytearray([(min(len(items), 15) << 4) | et])
        if len(items) >= 15:
            out += _unvarint(len(items))
        for x in items:
            out += bytes([1 if x else 2]) if et in (1, 2) else _write(et, x)
        return bytes(out)
    if t == 11:
        kt, vt, pairs, *declared = v
        count = declared[0] if declared else len(pairs)
        if not count:
            return b"\x00"
        out = bytearray(_unvarint(count))
        out.append((kt << 4) | vt)
        for k, x in pairs:
            out += _write(kt, k) + _write(vt, x)
        return bytes(out)
    if t == 12:
        return write_struct(v)
    raise ValueError(f"type {t}")


def write_struct(fields: dict[int, Any]) -> bytes:
    out = bytearray()
    last = 0
    for fid in sorted(fields):
        t, v = fields[fid]
        if t == 1:
            t = 1 if v else 2
        delta = fid - last
        if 0 < delta <= 15:
            out.append((delta << 4) | t)
        else:
            out.append(t)
            out += _unvarint(((fid << 1) ^ (fid >> 15)) & 0xFFFF)
        if t not in (1, 2):
            out += _write(t, v)
        last = fid
    out.append(0)
    return bytes(out)


# parquet.thrift field ids used below.
FILE_ROWS, FILE_GROUPS = 3, 4  # FileMetaData
GROUP_COLUMNS, GROUP_ROWS = 1, 3  # RowGroup
CHUNK_META = 3  # ColumnChunk
COL_VALUES, COL_UNCOMPRESSED, COL_STATS = 5, 6, 12  # ColumnMetaData
PAGE_TYPE, PAGE_UNCOMPRESSED, PAGE_COMPRESSED, PAGE_DATA = 1, 2, 3, 5  # PageHeader
DICTIONARY = 2  # PageType


def rewrite_parquet(path: Path, edit: Callable[[dict[int, Any], list[Any]], None]) -> Path:
    """Decode ``path``'s footer and every page (``[[header, body], ...]`` per column chunk per
    row group), let ``edit`` change them, and write the file back with the offsets and
    compressed sizes recomputed (so only what ``edit`` changed is a lie)."""
    b = path.read_bytes()
    (n,) = struct.unpack("<I", b[-8:-4])
    meta, _ = read_struct(b, len(b) - 8 - n)
    groups = []
    for rg in meta[FILE_GROUPS][1][1]:
        chunks = []
        for cc in rg[GROUP_COLUMNS][1][1]:
            md = cc[CHUNK_META][1]
            i = md[11][1] if 11 in md else md[9][1]
            end = i + md[7][1]
            pages = []
            while i < end:
                h, j = read_struct(b, i)
                pages.append([h, b[j : j + h[PAGE_COMPRESSED][1]]])
                i = j + h[PAGE_COMPRESSED][1]
            chunks.append(pages)
        groups.append(chunks)
    edit(meta, groups)
    out = bytearray(b"PAR1")
    for rg, chunks in zip(meta[FILE_GROUPS][1][1], groups, strict=True):
        rg_start = len(out)
        for cc, pages in zip(rg[GROUP_COLUMNS][1][1], chunks, strict=True):
            md, start, first = cc[CHUNK_META][1], len(out), None
            for h, body in pages:
                if h[PAGE_TYPE][1] == DICTIONARY:
                    md[11] = (6, len(out))
                elif first is None:
                    first = md[9] = (6, len(out))
                out += write_struct(h) + body
            md[7] = (6, len(out) - start)
            cc[2] = (6, start)
        for fid, value in ((5, rg_start), (6, len(out) - rg_start)):
            if fid in rg:
                rg[fid] = (6, value)
    footer = write_struct(meta)
    path.write_bytes(bytes(out) + footer + struct.pack("<I", len(footer)) + b"PAR1")
    return path
