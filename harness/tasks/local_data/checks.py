"""What every local dataset form is checked for before its values become Python objects: the
bounds (files, rows, decoded text), regular files, the prompt and answer columns and their types;
and the bounded read of Arrow record batches that both the directory and the Parquet reader use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from harness.core import limits

FORMS = "a save_to_disk directory, a .parquet or a .jsonl file"
_FIELDS = ("prompt_field", "answer_field")


def size_check(spec: str, files: list[Path], bounds: limits.DataBounds) -> None:
    """Refuse ``files`` that together hold more bytes than ``bounds.file_bytes``."""
    total = sum(f.stat().st_size for f in files)
    if total > bounds.file_bytes:
        raise ValueError(bounds.file_refusal(f"task '{spec}': the data files hold {total:,} bytes"))


def rows_check(spec: str, where: str, rows: int, bounds: limits.DataBounds) -> None:
    """Refuse ``rows`` (so far) above ``bounds.rows``."""
    if rows > bounds.rows:
        raise ValueError(bounds.rows_refusal(f"task '{spec}': {where} holds {rows:,} rows or more"))


def text_check(spec: str, where: str, nbytes: int, bounds: limits.DataBounds) -> None:
    """Refuse prompt and answer text (so far) that decodes to more than ``bounds.data_bytes``."""
    if nbytes > bounds.data_bytes:
        raise ValueError(
            bounds.data_refusal(
                f"task '{spec}': the prompt and answer columns of {where} decode to {nbytes:,} "
                "bytes or more"
            )
        )


def regular(spec: str, path: Path, what: str = "") -> None:
    """Refuse ``path`` unless it is a regular file (checked without opening it)."""
    kind = limits.not_regular(path)
    if kind is not None:
        raise ValueError(
            f"task '{spec}': {what}{path} is {kind}, not a regular file; hf: reads {FORMS}"
        )


def check_columns(spec: str, where: str, columns: list[str], fields: tuple[str, str]) -> None:
    """Refuse a prompt or answer column that is missing, or named more than once."""
    for name, col in zip(_FIELDS, fields, strict=True):
        if col not in columns:
            raise ValueError(
                f"task '{spec}': task_options.{name}: {where} has no column '{col}' "
                f"(columns: {', '.join(columns) or 'none'})"
            )
        if columns.count(col) > 1:  # which of them is meant cannot be told
            raise ValueError(
                f"task '{spec}': task_options.{name}: {where} has {columns.count(col)} columns "
                f"named '{col}'; a prompt or answer column must be named once"
            )


def check_types(spec: str, where: str, schema: Any, fields: tuple[str, str]) -> None:
    """Refuse a prompt or answer column that is neither text nor numbers before reading it: a
    list column can hold any number of values per row, and a view column any number of views
    of one buffer, so neither could be measured before being expanded (nor be a prompt)."""

    t = pa.types
    for name, col in zip(_FIELDS, fields, strict=True):
        tp = schema.field(col).type
        value = tp.value_type if t.is_dictionary(tp) else tp
        if not any(
            check(value)
            for check in (t.is_string, t.is_large_string, t.is_integer, t.is_floating, t.is_null)
        ):
            raise ValueError(
                f"task '{spec}': task_options.{name}: column '{col}' of {where} holds {tp}; a "
                "prompt or answer column holds text (string) or numbers"
            )


def text_bytes(column: Any) -> int:
    """Bytes of text ``column`` (a pyarrow Array or ChunkedArray) becomes once decoded.

    A dictionary-encoded chunk is measured through its indices (``sum(len(dictionary[i]))``)
    without being expanded; a value that is not text (a number) counts as 8 bytes."""

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    total = 0
    for chunk in chunks:
        values, indices = chunk, None
        if pa.types.is_dictionary(chunk.type):
            values, indices = chunk.dictionary, chunk.indices
        tp = values.type
        if pa.types.is_string(tp) or pa.types.is_large_string(tp):
            lengths = pc.binary_length(values)
            if indices is not None:
                lengths = pc.take(lengths, indices)
            total += int(pc.sum(lengths).as_py() or 0)
        else:
            total += 8 * len(chunk)
    return total


def read_batches(
    spec: str, where: str, batches: Any, fields: tuple[str, str], bounds: limits.DataBounds
) -> Any:
    """Columns ``fields`` of the record batches, bounded in rows and decoded bytes before any
    value becomes a Python object."""
    kept: list[Any] = []
    rows = nbytes = 0
    for batch in batches:
        rows += batch.num_rows
        rows_check(spec, where, rows, bounds)
        part = [batch.column(batch.schema.get_field_index(c)) for c in fields]
        nbytes += sum(text_bytes(col) for col in part)
        text_check(spec, where, nbytes, bounds)
        kept.append(part)
    columns: dict[str, list[Any]] = {c: [] for c in fields}
    for part in kept:
        for c, col in zip(fields, part, strict=True):
            columns[c].extend(col.to_pylist())
    return columns


def first_line(err: BaseException) -> str:
    """The first line of an error's message (its type where it has none)."""
    return str(err).splitlines()[0] if str(err) else type(err).__name__
