"""The page headers of a Parquet column chunk, read without decoding a page.

Why the harness reads them itself: Arrow allocates each page's decompression buffer at the size
the page's own header declares, before any caller sees a value, and the footer's column sizes
(``total_uncompressed_size``) are only what the writer claims: a file can declare a few bytes
there and then hold one page of 2 GB. Walking the headers first bounds every buffer Arrow will
allocate (a page that inflates past its declared size fails in the codec instead: Arrow
decompresses into the declared buffer).

A page header is a Thrift struct in the compact protocol (parquet-format's ``PageHeader``,
``src/main/thrift/parquet.thrift`` in apache/parquet-format): field 1 ``type`` (0 data page, 1
index page, 2 dictionary page, 3 data page v2), field 2 ``uncompressed_page_size``, field 3
``compressed_page_size``, and in fields 5 / 7 / 8 the data, dictionary and data-v2 page headers,
each with ``num_values`` as field 1. The compact protocol is apache/thrift's
``doc/specs/thrift-compact-protocol.md``: a field header byte holds the field id delta (high
nibble; 0 means a zigzag varint id follows) and the type (low nibble); integers are zigzag
varints; binaries a varint length and bytes; lists a size/type byte (size 15: a varint follows).
Only what this module needs is decoded; every other field is skipped by its type.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3
_NESTED_HEADER = {5: DATA_PAGE, 7: DICTIONARY_PAGE, 8: DATA_PAGE_V2}

# Compact-protocol type ids.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)
_MAX_DEPTH = 16  # page headers nest three deep (statistics); more is a crafted file


class BadHeader(ValueError):
    """A page header that is not a Parquet page header (cut short, or values out of range)."""


@dataclass(frozen=True)
class PageHeader:
    kind: int  # DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE or DATA_PAGE_V2
    uncompressed: int  # bytes once decompressed: what Arrow allocates to decompress it
    compressed: int  # bytes of the page body after the header
    num_values: int  # values (with nulls) of a data page; entries of a dictionary page
    header_bytes: int


class _Reader:
    def __init__(self, buf: memoryview, pos: int, end: int) -> None:
        self.buf, self.pos, self.end = buf, pos, end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise BadHeader("cut short")
        b = self.buf[self.pos]
        self.pos += 1
        return int(b)

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise BadHeader("a varint longer than 64 bits")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, kind: int, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise BadHeader("nested too deep")
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self.byte()
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.advance(8)
        elif kind == _BINARY:
            self.advance(self.varint())
        elif kind in (_LIST, _SET):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            for _ in range(size):
                self.skip(_BYTE if elem in (_TRUE, _FALSE) else elem, depth + 1)
        elif kind == _MAP:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip(types >> 4, depth + 1)
                    self.skip(types & 0x0F, depth + 1)
        elif kind == _STRUCT:
            for _fid, ftype in self.fields():
                self.skip(ftype, depth + 1)
        else:
            raise BadHeader(f"unknown field type {kind}")

    def advance(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise BadHeader("cut short")
        self.pos += n

    def fields(self) -> Iterator[tuple[int, int]]:
        """(field id, type) of each field of the struct at the position, up to its stop byte;
        the caller reads or skips each value before asking for the next."""
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            delta, kind = head >> 4, head & 0x0F
            last = last + delta if delta else self.zigzag()
            yield last, kind


def _int(r: _Reader, kind: int) -> int:
    if kind not in (_I16, _I32, _I64):
        raise BadHeader("a size that is not an integer")
    return r.zigzag()


def read_header(buf: memoryview, pos: int, end: int) -> PageHeader:
    """The page header at ``buf[pos:]`` (nothing past ``end`` is read)."""
    r = _Reader(buf, pos, end)
    kind = uncompressed = compressed = -1
    num_values = 0
    for fid, ftype in r.fields():
        if fid == 1:
            kind = _int(r, ftype)
        elif fid == 2:
            uncompressed = _int(r, ftype)
        elif fid == 3:
            compressed = _int(r, ftype)
        elif fid in _NESTED_HEADER and ftype == _STRUCT:
            for sub, stype in r.fields():
                if sub == 1:
                    num_values = _int(r, stype)
                else:
                    r.skip(stype, 1)
        else:
            r.skip(ftype, 0)
    if kind not in (DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2):
        raise BadHeader(f"page type {kind}")
    if uncompressed < 0 or compressed < 0 or num_values < 0:
        raise BadHeader("a negative size")
    return PageHeader(kind, uncompressed, compressed, num_values, r.pos - pos)


def page_headers(buf: memoryview, start: int, length: int) -> Iterator[PageHeader]:
    """Every page header of the column chunk at ``buf[start:start + length]``, in order: each
    page's body is skipped by its declared compressed size, never read."""
    end = start + length
    if start < 0 or length < 0 or end > len(buf):
        raise BadHeader("the column chunk lies outside the file")
    pos = start
    while pos < end:
        header = read_header(buf, pos, end)
        pos += header.header_bytes + header.compressed
        if pos > end:
            raise BadHeader("a page runs past its column chunk")
        yield header


__all__ = ["BadHeader", "PageHeader", "page_headers", "read_header"]
