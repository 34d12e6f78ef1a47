"""``csv:PATH``: prompt/answer pairs from a CSV file, scored as ``jsonl:``.

The first non-blank row is the header and names exactly the columns ``prompt`` and ``answer``
(either order; spaces around a name are ignored). Every later row gives both, as in RFC 4180: a
comma between fields, a field with a comma, quote or line break quoted with ``"``, a quote
inside one doubled. Blank lines are skipped; a UTF-8 byte-order mark (Excel's "CSV UTF-8") is
dropped. A CSV field is always text, so an answer ``15`` is the string ``"15"``: the numeric
match reads it as the number.

Bounded as a JSONL file (``docs/limits.md``): a regular file only, never opened otherwise (a
FIFO would hang the command); at most ``MAX_TASK_FILE_BYTES``, checked before reading; at most
``MAX_TASK_ROWS`` rows (``task_options.max_file_mib`` / ``max_rows`` move both); each prompt and
answer at most ``MAX_TEXT_CHARS``. A problem is one line
naming the file and the line. Held-out split, scoring and options are those of ``jsonl:``
(:class:`harness.tasks.pairs.PairOptions`).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import BinaryIO

from harness.core import limits
from harness.tasks.base import Example
from harness.tasks.pairs import PairOptions, PairTask, pair_file_source, pair_file_task
from harness.tasks.records import open_task_file, pairs_from_records, utf8_lines
from harness.tasks.registry import register

COLUMNS = ("prompt", "answer")


def _lines(spec: str, path: str, fh: BinaryIO) -> Iterator[str]:
    """The file's lines, decoded (an Excel byte-order mark dropped); a byte that is not UTF-8
    names its line."""
    for lineno, line in utf8_lines(spec, path, fh):
        yield line.removeprefix("\ufeff") if lineno == 1 else line


def _header(spec: str, path: str, lineno: int, row: list[str]) -> list[str]:
    """The header's column names, refused unless they are exactly ``prompt`` and ``answer``."""
    names = [cell.strip() for cell in row]
    at = f"task '{spec}': {path} line {lineno}"
    allowed = "'prompt', 'answer'"
    for i, name in enumerate(names):
        if name not in COLUMNS:
            raise ValueError(f"{at}: unknown column {name!r} (allowed: {allowed})")
        if name in names[:i]:
            raise ValueError(f"{at}: column {name!r} appears twice")
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise ValueError(
            f"{at}: missing column '{missing[0]}' (the header row must name 'prompt' and "
            "'answer'; leave an answer empty where the reward does not use it)"
        )
    return names


def read_csv(
    spec: str, path: str, bounds: limits.DataBounds = limits.DEFAULT_DATA_BOUNDS
) -> list[Example]:
    """The examples of CSV file ``path`` (see the module docstring), within ``bounds``. ``~`` is
    expanded; a relative path is relative to the current directory."""
    fh = open_task_file(spec, path, bounds)
    records: list[tuple[int, dict[str, str]]] = []
    names: list[str] | None = None
    # The csv module's own bound on one field (128 Ki characters) is below ours: it is set to
    # one past ours for this read, so a field one over is refused by pairs_from_records (naming
    # its column and length) and a longer one by the reader, before it is held whole.
    old_limit = csv.field_size_limit(limits.MAX_TEXT_CHARS + 1)
    try:
        with fh:
            reader = csv.reader(_lines(spec, path, fh), strict=True)
            while True:
                start = reader.line_num + 1  # the row's first line (a quoted field may span more)
                try:
                    row = next(reader)
                except StopIteration:
                    break
                except csv.Error as err:
                    why = str(err)
                    if why.startswith("field larger than field limit"):
                        top = limits.MAX_TEXT_CHARS
                        why = (
                            f"a field holds more than {top:,} characters; a prompt or answer may "
                            f"hold at most {top:,}"
                        )
                    raise ValueError(f"task '{spec}': {path} line {start}: {why}") from None
                if not row or (len(row) == 1 and not row[0].strip()):  # a blank line
                    continue
                if names is None:
                    names = _header(spec, path, start, row)
                    continue
                if len(row) != len(names):
                    raise ValueError(
                        f"task '{spec}': {path} line {start}: {len(row)} field(s); the header "
                        f"has {len(names)} ({','.join(names)})"
                    )
                if len(records) >= bounds.rows:
                    raise ValueError(
                        bounds.rows_refusal(
                            f"task '{spec}': {path} holds more than {bounds.rows:,} rows"
                        )
                    )
                records.append((start, dict(zip(names, row, strict=True))))
    finally:
        csv.field_size_limit(old_limit)
    if names is None:
        raise ValueError(f"task '{spec}': {path} is empty (expected the header row prompt,answer)")
    return pairs_from_records(spec, path, records, bounds=bounds)


def csv_task(spec: str, path: str, o: PairOptions) -> PairTask:
    """``csv:PATH`` (see the module docstring)."""
    return pair_file_task(spec, path, o, read_csv)


register(
    pair_file_source(
        "csv:PATH",
        "a CSV file with the header row `prompt,answer`; scored as `jsonl:`",
        csv_task,
        rank=15,
        field_help="CSV header prompt,answer",
    )
)
