"""A ``.parquet`` file: refused when encrypted, its footer's and every page header's sizes
checked against the bounds before Arrow reads a page, then read in batches (dictionaries kept)."""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from harness.core import limits
from harness.tasks.local_data import checks
from harness.tasks.parquet_pages import (
    DATA_PAGE,
    DATA_PAGE_V2,
    BadHeader,
    encryption,
    page_headers,
)
from harness.tasks.records import file_digest


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[memoryview]:
    """The bytes of ``path``, memory-mapped (an empty file: no bytes; mmap refuses one)."""
    with path.open("rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            yield memoryview(b"")
            return
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            buf = memoryview(mm)
            try:
                yield buf
            finally:
                buf.release()


# Rows Arrow decodes at a time: each batch is measured before the next is decoded.
PARQUET_BATCH_ROWS = 65_536


def _check_pages(
    spec: str, path: Path, meta: Any, leaf: list[int], group_rows: list[int], bounds: Any
) -> None:
    """Refuse a file whose page headers declare more than the bounds allow, before Arrow reads a
    page (it allocates each page's buffer at its declared size; the footer's sizes are only
    claims). The values of a flat column chunk's pages cannot outnumber its row group's rows,
    nor its pages (a dictionary page, and one empty page) exceed them by more than two, so the
    walk is bounded by the rows checked before."""
    where = str(path)
    declared = 0
    with _mapped(path) as buf:
        for g, rows in enumerate(group_rows):
            for i in leaf:
                col = meta.row_group(g).column(i)
                # Arrow reads a chunk's pages while it has seen fewer values than the chunk
                # declares (column_reader.cc SerializedPageReader::NextPage): none of a chunk of
                # no values, which pyarrow writes, in a row group of no rows, with a data page
                # offset of 0 (no page lies there).
                if col.num_values <= 0:
                    continue
                # Where Arrow starts reading the chunk (file_reader.cc ComputeColumnChunkRange).
                start = col.data_page_offset
                first = col.dictionary_page_offset
                if col.has_dictionary_page and first is not None and 0 < first < start:
                    start = first
                values = pages = 0
                try:
                    for page in page_headers(buf, start, col.total_compressed_size):
                        declared += page.uncompressed
                        if declared > bounds.data_bytes:
                            raise ValueError(
                                bounds.data_refusal(
                                    f"task '{spec}': the pages of the prompt and answer "
                                    f"columns of {where} declare {declared:,} bytes or more "
                                    "once decompressed"
                                )
                            )
                        pages += 1
                        if page.kind in (DATA_PAGE, DATA_PAGE_V2):
                            values += page.num_values
                        if values > rows or pages > rows + 2:
                            raise BadHeader(
                                f"{pages:,} pages of {values:,} values for {rows:,} rows"
                            )
                except BadHeader as err:
                    raise ValueError(
                        f"task '{spec}': cannot read {where} as Parquet (a page header of "
                        f"column '{col.path_in_schema}' in row group {g}: {err})"
                    ) from None


def read_parquet(spec: str, path: Path, fields: tuple[str, str], bounds: limits.DataBounds) -> Any:
    checks.regular(spec, path)
    checks.size_check(spec, [path], bounds)
    _check_unencrypted(spec, path)
    try:
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
        checks.check_columns(spec, str(path), list(schema.names), fields)
        checks.check_types(spec, str(path), schema, fields)
        meta = pf.metadata
        # The footer states the file's rows and each row group's apart, and Arrow reads by row
        # group: a file that states 10 rows over a row group of 20 M is judged by the larger.
        group_rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        if min([meta.num_rows, *group_rows]) < 0:
            raise ValueError(
                f"task '{spec}': cannot read {path} as Parquet (its footer states a negative "
                "row count)"
            )
        checks.rows_check(spec, str(path), max(meta.num_rows, sum(group_rows)), bounds)
        # Decompressed (still encoded) size of the two columns, from the footer, then from every
        # page header (what Arrow allocates; the footer's figure is the writer's claim).
        leaf = [i for i in range(meta.num_columns) if meta.schema.column(i).path in fields]
        encoded = sum(
            meta.row_group(g).column(i).total_uncompressed_size
            for g in range(meta.num_row_groups)
            for i in leaf
        )
        checks.text_check(spec, str(path), encoded, bounds)
        _check_pages(spec, path, meta, leaf, group_rows, bounds)
        t = pa.types
        text = [
            c for c in fields if t.is_string(tp := schema.field(c).type) or t.is_large_string(tp)
        ]

        # Dictionary pages stay dictionaries: 20 M rows of one word cost their indices (a
        # large_string column too: Arrow would expand it).
        coded = pq.ParquetFile(path, read_dictionary=text)
        batches = coded.iter_batches(
            batch_size=PARQUET_BATCH_ROWS, columns=sorted(set(fields)), use_threads=False
        )
        columns = checks.read_batches(spec, str(path), batches, fields, bounds)
    except pa.ArrowException as err:  # ArrowInvalid is a ValueError, too: Arrow's words alone
        raise ValueError(
            f"task '{spec}': cannot read {path} as Parquet ({checks.first_line(err)})"
        ) from None
    except ValueError:
        raise
    except Exception as err:
        raise ValueError(
            f"task '{spec}': cannot read {path} as Parquet ({checks.first_line(err)})"
        ) from None
    return str(path), columns, file_digest(path)


def _check_unencrypted(spec: str, path: Path) -> None:
    """Refuse an encrypted Parquet file before Arrow opens it: without keys Arrow may end the
    process rather than raise (:func:`harness.tasks.parquet_pages.encryption`)."""
    with _mapped(path) as buf:
        try:
            why = encryption(buf)
        except BadHeader as err:
            raise ValueError(
                f"task '{spec}': cannot read {path} as Parquet (its footer: {err})"
            ) from None
    if why is not None:
        raise ValueError(
            f"task '{spec}': {path} is an encrypted Parquet file ({why}); hf: reads unencrypted "
            "files only"
        )
