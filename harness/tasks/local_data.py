"""``hf:PATH``: prompt/answer pairs from a local dataset; nothing is ever downloaded.

``PATH`` is one of

* a directory written by ``datasets``' ``save_to_disk`` (a ``Dataset``, or a ``DatasetDict``
  whose split ``task_options.split`` names; default ``train``),
* a ``.parquet`` file,
* a ``.jsonl`` file (one JSON object per line),

with the prompt and answer columns named by ``prompt_field`` / ``answer_field`` (defaults
``prompt`` / ``answer``). Anything that is not an existing local path (a hub name such as
``openai/gsm8k``) is refused: the harness never fetches data at run time.

Bounded before anything becomes a Python object (the numbers are in :mod:`harness.core.limits`
and ``docs/limits.md``): only regular files are read, never opened otherwise (a FIFO would hang
the command); a dataset directory's shards must lie inside it, symlinks resolved; the files
actually read hold at most ``MAX_TASK_FILE_BYTES``; the rows at most ``MAX_TASK_ROWS`` (from the
Parquet metadata before reading, per Arrow batch otherwise); the prompt and answer columns must
hold text or numbers and decode to at most ``MAX_TASK_DATA_BYTES`` (a dictionary-encoded column is
measured without being expanded); each prompt and answer at most ``MAX_TEXT_CHARS``. A run moves
the first three with ``task_options.max_file_mib`` / ``max_rows`` / ``max_data_mib``. Scoring, the
held-out split and the options ``reward``, ``answer_format``, ``format_weight``, ``think`` and
``eval_fraction`` are those of ``jsonl:`` (:mod:`harness.tasks.pairs`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness.core import limits
from harness.tasks import arrow_messages
from harness.tasks.pairs import (
    PairTask,
    answer_options,
    check_reference_answers,
    data_bounds,
    file_digest,
    pairs_from_records,
    read_jsonl,
)
from harness.tasks.parquet_pages import (
    DATA_PAGE,
    DATA_PAGE_V2,
    BadHeader,
    encryption,
    page_headers,
)

_FORMS = "a save_to_disk directory, a .parquet or a .jsonl file"
_FIELDS = ("prompt_field", "answer_field")


def _size_check(spec: str, files: list[Path], bounds: limits.DataBounds) -> None:
    total = sum(f.stat().st_size for f in files)
    if total > bounds.file_bytes:
        raise ValueError(bounds.file_refusal(f"task '{spec}': the data files hold {total:,} bytes"))


def _rows_check(spec: str, where: str, rows: int, bounds: limits.DataBounds) -> None:
    if rows > bounds.rows:
        raise ValueError(bounds.rows_refusal(f"task '{spec}': {where} holds {rows:,} rows or more"))


def _text_check(spec: str, where: str, nbytes: int, bounds: limits.DataBounds) -> None:
    if nbytes > bounds.data_bytes:
        raise ValueError(
            bounds.data_refusal(
                f"task '{spec}': the prompt and answer columns of {where} decode to {nbytes:,} "
                "bytes or more"
            )
        )


def _regular(spec: str, path: Path, what: str = "") -> None:
    kind = limits.not_regular(path)
    if kind is not None:
        raise ValueError(
            f"task '{spec}': {what}{path} is {kind}, not a regular file; hf: reads {_FORMS}"
        )


def _check_columns(spec: str, where: str, columns: list[str], fields: tuple[str, str]) -> None:
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


def _check_types(spec: str, where: str, schema: Any, fields: tuple[str, str]) -> None:
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


def _inside(spec: str, base: Path, name: str, what: str) -> Path:
    """``base / name`` resolved (symlinks followed), refused unless it lies inside ``base``."""
    real_base = Path(os.path.realpath(base))
    target = Path(os.path.realpath(base / name))
    if Path(name).is_absolute() or not target.is_relative_to(real_base):
        raise ValueError(
            f"task '{spec}': {what} '{name}' of {base} resolves to {target}, outside the dataset "
            "directory; a dataset directory's files must lie inside it"
        )
    return target


def _json(spec: str, path: Path, what: str) -> Any:
    """The JSON of a dataset directory's small index file, read bounded (at most 1 MiB)."""
    try:
        text = limits.read_bounded_text(path, limits.MIB, f"a datasets {what} file")
    except ValueError as err:  # a FIFO, over 1 MiB, not UTF-8: the reason names the file
        raise ValueError(f"task '{spec}': {str(err).splitlines()[0]}") from None
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError(
            f"task '{spec}': {path} is not a datasets {what} file (not JSON)"
        ) from None


def _split_dir(spec: str, root: Path, split: str | None) -> tuple[Path, str]:
    """(directory of the chosen dataset, its name in messages) of a save_to_disk directory."""
    index = root / "dataset_dict.json"
    if os.path.lexists(index):
        _regular(spec, index)
        try:
            splits = _json(spec, index, "split index")["splits"]
            names = [str(s) for s in splits]
        except (KeyError, TypeError):
            raise ValueError(
                f"task '{spec}': {root}/dataset_dict.json is not a datasets split index"
            ) from None
        chosen = split if split is not None else "train"
        if chosen not in names:
            raise ValueError(
                f"task '{spec}': task_options.split: {root} has no split '{chosen}' (splits: "
                f"{', '.join(names)})"
            )
        return _inside(spec, root, chosen, "split"), f"{root} split '{chosen}'"
    if os.path.lexists(root / "state.json"):
        if split is not None:
            raise ValueError(
                f"task '{spec}': task_options.split: {root} is one dataset without splits; "
                "remove split"
            )
        return root, str(root)
    raise ValueError(
        f"task '{spec}': directory '{root}' is not a save_to_disk dataset (no dataset_dict.json "
        f"or state.json); hf: reads {_FORMS}"
    )


def _member(spec: str, base: Path, name: str, what: str) -> Path:
    """``base / name``: an existing regular file inside ``base`` (symlinks resolved)."""
    path = _inside(spec, base, name, what)
    _regular(spec, path, f"{what} ")
    if not path.exists():
        raise ValueError(f"task '{spec}': {what} '{name}' of {base} does not exist")
    return path


def _shards(spec: str, where_dir: Path) -> tuple[Path, list[Path]]:
    """(``state.json``, the Arrow files it names), each checked to be a regular file inside
    ``where_dir`` (a shard named ``../../big.arrow`` or a symlink out is refused)."""
    state_path = _member(spec, where_dir, "state.json", "state file")
    state = _json(spec, state_path, "state")
    entries = state.get("_data_files") if isinstance(state, dict) else None
    names = [e.get("filename") if isinstance(e, dict) else None for e in entries or []]
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(
            f"task '{spec}': {state_path} names no data files (expected '_data_files': "
            "[{'filename': ...}, ...])"
        )
    if len(names) > limits.MAX_DATASET_SHARDS:
        raise ValueError(
            f"task '{spec}': {state_path} names {len(names):,} data files; a dataset may have "
            f"at most {limits.MAX_DATASET_SHARDS:,} (save it with fewer num_shards)"
        )
    return state_path, [_member(spec, where_dir, str(n), "data file") for n in names]


def _dir_digest(files: list[Path], base: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: str(f.relative_to(base))):
        h.update(str(f.relative_to(base)).encode())
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(limits.MIB), b""):
                h.update(block)
    return h.hexdigest()


def _read_batches(
    spec: str, where: str, batches: Any, fields: tuple[str, str], bounds: limits.DataBounds
) -> Any:
    """Columns ``fields`` of the record batches, bounded in rows and decoded bytes before any
    value becomes a Python object."""
    kept: list[Any] = []
    rows = nbytes = 0
    for batch in batches:
        rows += batch.num_rows
        _rows_check(spec, where, rows, bounds)
        part = [batch.column(batch.schema.get_field_index(c)) for c in fields]
        nbytes += sum(text_bytes(col) for col in part)
        _text_check(spec, where, nbytes, bounds)
        kept.append(part)
    columns: dict[str, list[Any]] = {c: [] for c in fields}
    for part in kept:
        for c, col in zip(fields, part, strict=True):
            columns[c].extend(col.to_pylist())
    return columns


def _check_declared(spec: str, where: str, shards: list[Path], bounds: limits.DataBounds) -> None:
    """Refuse shards whose record batches declare more rows, or more bytes to decompress, than
    the bounds allow, before Arrow decodes one (it decompresses a batch into buffers of the
    sizes the batch declares; an uncompressed batch is read in place from the memory map)."""

    rows = decompressed = 0
    for shard in shards:
        with pa.memory_map(str(shard)) as source:
            for message in pa.ipc.MessageReader.open_stream(source):
                body = memoryview(message.body) if message.body is not None else b""
                try:
                    got = arrow_messages.declared(memoryview(message.metadata), body)
                except arrow_messages.BadMessage as err:
                    raise ValueError(f"task '{spec}': cannot read {where} ({err})") from None
                rows += got.rows
                decompressed += got.decompressed
                _rows_check(spec, where, rows, bounds)
                if decompressed > bounds.data_bytes:
                    raise ValueError(
                        bounds.data_refusal(
                            f"task '{spec}': the record batches of {where} declare "
                            f"{decompressed:,} bytes or more to decompress"
                        )
                    )


def _read_saved(
    spec: str,
    root: Path,
    split: str | None,
    fields: tuple[str, str],
    bounds: limits.DataBounds,
) -> Any:

    where_dir, where = _split_dir(spec, root, split)
    state, shards = _shards(spec, where_dir)
    read = [state, *shards]
    info = where_dir / "dataset_info.json"
    with contextlib.suppress(ValueError):  # hashed when present, as before; never needed
        read.append(_member(spec, where_dir, info.name, "info file"))
    _size_check(spec, read[1:], bounds)

    def batches(stack: contextlib.ExitStack) -> Any:
        _check_declared(spec, where, shards, bounds)
        for shard in shards:
            reader = pa.ipc.open_stream(stack.enter_context(pa.memory_map(str(shard))))
            _check_columns(spec, where, list(reader.schema.names), fields)
            _check_types(spec, where, reader.schema, fields)
            yield from reader

    try:
        with contextlib.ExitStack() as stack:
            columns = _read_batches(spec, where, batches(stack), fields, bounds)
    except pa.ArrowException as err:  # ArrowInvalid is a ValueError, too: Arrow's words alone
        raise ValueError(f"task '{spec}': cannot read {where} ({_first_line(err)})") from None
    except ValueError:
        raise
    except Exception as err:  # a user's files: any failure to read them is bad input
        raise ValueError(f"task '{spec}': cannot read {where} ({_first_line(err)})") from None
    return where, columns, _dir_digest(read, Path(os.path.realpath(root)))


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__


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


def _read_parquet(spec: str, path: Path, fields: tuple[str, str], bounds: limits.DataBounds) -> Any:
    _regular(spec, path)
    _size_check(spec, [path], bounds)
    _check_unencrypted(spec, path)
    try:
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
        _check_columns(spec, str(path), list(schema.names), fields)
        _check_types(spec, str(path), schema, fields)
        meta = pf.metadata
        # The footer states the file's rows and each row group's apart, and Arrow reads by row
        # group: a file that states 10 rows over a row group of 20 M is judged by the larger.
        group_rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        if min([meta.num_rows, *group_rows]) < 0:
            raise ValueError(
                f"task '{spec}': cannot read {path} as Parquet (its footer states a negative "
                "row count)"
            )
        _rows_check(spec, str(path), max(meta.num_rows, sum(group_rows)), bounds)
        # Decompressed (still encoded) size of the two columns, from the footer, then from every
        # page header (what Arrow allocates; the footer's figure is the writer's claim).
        leaf = [i for i in range(meta.num_columns) if meta.schema.column(i).path in fields]
        encoded = sum(
            meta.row_group(g).column(i).total_uncompressed_size
            for g in range(meta.num_row_groups)
            for i in leaf
        )
        _text_check(spec, str(path), encoded, bounds)
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
        columns = _read_batches(spec, str(path), batches, fields, bounds)
    except pa.ArrowException as err:  # ArrowInvalid is a ValueError, too: Arrow's words alone
        raise ValueError(
            f"task '{spec}': cannot read {path} as Parquet ({_first_line(err)})"
        ) from None
    except ValueError:
        raise
    except Exception as err:
        raise ValueError(
            f"task '{spec}': cannot read {path} as Parquet ({_first_line(err)})"
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


def hf_task(
    spec: str,
    path: str,
    *,
    prompt_field: str,
    answer_field: str,
    split: str | None,
    eval_fraction: float,
    reward: str,
    answer_format: str,
    format_weight: float,
    think: bool,
    max_rows: int = limits.MAX_TASK_ROWS,
    max_file_mib: int = limits.MAX_TASK_FILE_BYTES // limits.MIB,
    max_data_mib: int = limits.MAX_TASK_DATA_BYTES // limits.MIB,
) -> PairTask:
    """``hf:PATH`` (see the module docstring); ``max_*`` move the data bounds
    (:class:`harness.tasks.pairs.DataLimitOptions`). Raises a one-line ``ValueError``."""
    bounds = data_bounds(max_rows, max_file_mib, max_data_mib)
    if not path:
        raise ValueError(f"task '{spec}': expected hf:PATH ({_FORMS})")
    p = Path(path).expanduser()
    if not p.exists() and limits.not_regular(p) != "a symlink loop":
        raise ValueError(
            f"task '{spec}': '{path}' is not a local path; hf: reads {_FORMS} on this machine "
            "and downloads nothing (save a hub dataset with save_to_disk first)"
        )
    scorer, answer_spec, changed = answer_options(spec, reward, answer_format, format_weight, think)
    fields = (prompt_field, answer_field)
    if not p.is_dir():
        _regular(spec, p)
    if p.is_file() and split is not None:
        raise ValueError(
            f"task '{spec}': task_options.split: applies to a save_to_disk directory only"
        )
    if p.is_dir():
        where, columns, digest = _read_saved(spec, p, split, fields, bounds)
    elif p.suffix == ".parquet":
        where, columns, digest = _read_parquet(spec, p, fields, bounds)
    elif p.suffix == ".jsonl":
        # Other keys are ordinary dataset columns, ignored as in a Parquet file.
        examples = read_jsonl(
            spec,
            path,
            prompt_field=prompt_field,
            answer_field=answer_field,
            only_fields=False,
            bounds=bounds,
        )
        where, columns, digest = None, None, file_digest(p)
    else:
        raise ValueError(f"task '{spec}': '{path}' is not {_FORMS}")
    if columns is not None:
        rows = zip(columns[prompt_field], columns[answer_field], strict=True)
        records = (
            (i, {prompt_field: a, answer_field: b}) for i, (a, b) in enumerate(rows, start=1)
        )
        examples = pairs_from_records(
            spec,
            str(where),
            records,
            prompt_field=prompt_field,
            answer_field=answer_field,
            row="row",
            bounds=bounds,
        )
    options = {"prompt_field": prompt_field, "answer_field": answer_field, "split": split}
    task = PairTask(
        spec,
        examples,
        scorer,
        eval_fraction=eval_fraction,
        fingerprint=digest,
        answer_spec=answer_spec,
        options={**options, **changed},
    )
    check_reference_answers(task, reward)
    return task


__all__ = ["hf_task"]
