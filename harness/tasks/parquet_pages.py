"""The page headers of a Parquet column chunk, and the encryption its footer declares, read
without decoding a page.

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
Only what this module needs is decoded; every other field is skipped by its type. A list, set
or map is bounded by the bytes left before it is looped over (each element takes a byte or
more), so every walk advances and ends: a header that declares 2^62 booleans is refused, not
counted.

Why the footer too (:func:`encryption`): given an encrypted file and no keys, Arrow can end the
whole process (a C++ exception thrown out of a column's metadata: ``terminate called``,
SIGABRT) instead of raising, so the marks of encryption are read here before Arrow opens it.
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
        self.pos = _skip(self.buf, self.pos, self.end, kind, depth)

    def fits(self, count: int, least: int, what: str) -> None:
        """Refuse a collection that declares more elements than the bytes left could hold
        (every element takes ``least`` bytes or more), before looping over them."""
        _fits(count, least, self.end - self.pos, what)

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


def _varint_end(buf: memoryview, pos: int, end: int) -> int:
    """Where the varint at ``pos`` ends (its value unread)."""
    stop = min(end, pos + 10)
    while pos < stop:
        if not buf[pos] & 0x80:
            return pos + 1
        pos += 1
    raise BadHeader("cut short" if stop == end else "a varint longer than 64 bits")


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= end:
            raise BadHeader("cut short")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise BadHeader("a varint longer than 64 bits")


def _fits(count: int, least: int, left: int, what: str) -> None:
    if count * least > left:
        raise BadHeader(f"{what} of {count:,} elements in {left:,} bytes")


def _skip(buf: memoryview, pos: int, end: int, kind: int, depth: int) -> int:
    """Where the value of type ``kind`` at ``pos`` ends. Every collection is bounded before it
    is looped over (each element reads a byte or more, see :func:`_element`), so the walk
    always advances and ends within ``end - pos`` steps. One function rather than the
    reader's methods: a footer holds a few dozen values per column chunk, and this is the
    loop that walks them."""
    if depth > _MAX_DEPTH:
        raise BadHeader("nested too deep")
    if kind in (_TRUE, _FALSE):
        return pos
    if kind == _BYTE:
        if pos >= end:
            raise BadHeader("cut short")
        return pos + 1
    if kind in (_I16, _I32, _I64):
        return _varint_end(buf, pos, end)
    if kind == _DOUBLE:
        if pos + 8 > end:
            raise BadHeader("cut short")
        return pos + 8
    if kind == _BINARY:
        n, pos = _varint(buf, pos, end)
        if pos + n > end:
            raise BadHeader("cut short")
        return pos + n
    if kind in (_LIST, _SET):
        if pos >= end:
            raise BadHeader("cut short")
        head = buf[pos]
        size, elem = head >> 4, _element(head & 0x0F)
        pos += 1
        if size == 15:
            size, pos = _varint(buf, pos, end)
        _fits(size, 1, end - pos, "a list")
        for _ in range(size):
            pos = _skip(buf, pos, end, elem, depth + 1)
        return pos
    if kind == _MAP:
        size, pos = _varint(buf, pos, end)
        if not size:
            return pos
        if pos >= end:
            raise BadHeader("cut short")
        types = buf[pos]
        pos += 1
        _fits(size, 2, end - pos, "a map")
        key, value = _element(types >> 4), _element(types & 0x0F)
        for _ in range(size):
            pos = _skip(buf, pos, end, key, depth + 1)
            pos = _skip(buf, pos, end, value, depth + 1)
        return pos
    if kind == _STRUCT:
        while True:
            if pos >= end:
                raise BadHeader("cut short")
            head = buf[pos]
            pos += 1
            if head == 0:
                return pos
            if not head >> 4:  # a field id as a zigzag varint
                pos = _varint_end(buf, pos, end)
            pos = _skip(buf, pos, end, head & 0x0F, depth + 1)
    raise BadHeader(f"unknown field type {kind}")


def _element(kind: int) -> int:
    """How an element of a list, set or map is skipped: a bool there is a whole byte (in a
    struct's field it is the field header's type), so every element reads a byte or more."""
    return _BYTE if kind in (_TRUE, _FALSE) else kind


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


# parquet.thrift field ids that mark an encrypted file.
_FILE_ROW_GROUPS, _FILE_ENCRYPTION, _FILE_SIGNING_KEY = 4, 8, 9  # FileMetaData
_GROUP_COLUMNS = 1  # RowGroup
_CHUNK_CRYPTO, _CHUNK_ENCRYPTED_META = 8, 9  # ColumnChunk
_MAGIC, _ENCRYPTED_MAGIC = b"PAR1", b"PARE"


def encryption(buf: memoryview) -> str | None:
    """What marks the Parquet file ``buf`` as encrypted (a phrase), or None when nothing does.

    An encrypted footer ends the file with ``PARE`` instead of ``PAR1``; a plaintext footer of an
    encrypted file sets FileMetaData's ``encryption_algorithm`` (field 8) or
    ``footer_signing_key_metadata`` (9), and an encrypted column sets ColumnChunk's
    ``crypto_metadata`` (8) or ``encrypted_column_metadata`` (9) (parquet-format's
    ``Encryption.md``). A file that ends in neither magic, or whose footer length does not fit,
    is left to Arrow, which refuses it."""
    size = len(buf)
    if size < 12:
        return None
    magic = bytes(buf[size - 4 :])
    if magic == _ENCRYPTED_MAGIC:
        return "its footer is encrypted: it ends in PARE"
    length = int.from_bytes(buf[size - 8 : size - 4], "little")
    if magic != _MAGIC or length > size - 12:
        return None
    r = _Reader(buf, size - 8 - length, size - 8)
    for fid, ftype in r.fields():
        if fid in (_FILE_ENCRYPTION, _FILE_SIGNING_KEY):
            return "its plaintext footer names an encryption algorithm or signing key"
        if fid == _FILE_ROW_GROUPS and ftype == _LIST:
            for group in _structs(r):
                for gid, gtype in group:
                    if gid != _GROUP_COLUMNS or gtype != _LIST:
                        r.skip(gtype, 2)
                        continue
                    for chunk in _structs(r):
                        for cid, ctype in chunk:
                            if cid in (_CHUNK_CRYPTO, _CHUNK_ENCRYPTED_META):
                                return "its footer marks a column as encrypted"
                            r.skip(ctype, 4)
        else:
            r.skip(ftype, 0)
    return None


def _structs(r: _Reader) -> Iterator[Iterator[tuple[int, int]]]:
    """The fields of each struct of the list at the reader's position (each bounded by the bytes
    left, as :meth:`_Reader.skip` bounds a list)."""
    head = r.byte()
    size, elem = head >> 4, head & 0x0F
    if size == 15:
        size = r.varint()
    if size and elem != _STRUCT:
        raise BadHeader("a list of row groups or columns that are not structs")
    r.fits(size, 1, "a list")
    for _ in range(size):
        yield r.fields()


__all__ = ["BadHeader", "PageHeader", "encryption", "page_headers", "read_header"]
