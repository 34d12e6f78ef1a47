"""Prompt/answer rows read into ``Example``s: from any records (a JSONL file's lines, a CSV
file's rows, a dataset's columns, a ``python:`` task's ``examples()``), every row checked and the
text bounded as it arrives (:mod:`harness.core.limits`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from harness.core import limits
from harness.tasks.base import Example


def answer_text(value: Any) -> str | None:
    """An answer cell as text: a string as is, a number as ``str`` gives it; None otherwise (a
    bool, a list, a missing value)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return None


def pairs_from_records(
    spec: str,
    where: str,
    records: Iterable[tuple[int, Any]],
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    row: str = "",
    only_fields: bool = True,
    bounds: limits.DataBounds = limits.DEFAULT_DATA_BOUNDS,
) -> list[Example]:
    """``where`` names the file ("PATH", rows are "line N") or "examples()" (rows are "item N");
    ``row`` overrides the row word ("row" for a dataset).

    Every row must carry both keys: a missing answer read as ``""`` would score an empty
    completion 1.0.  ``only_fields``: any other key is refused too (a misspelt ``anwser``); a
    dataset whose extra columns are ordinary (``hf:``) passes False.  The prompts and answers
    together may hold at most ``bounds.data_bytes`` of UTF-8 text (what ``hf:`` measures in its
    columns before decoding; here, for JSONL, CSV and ``examples()``, as the rows arrive)."""
    row = row or ("item" if where == "examples()" else "line")
    allowed = (prompt_field, answer_field)
    out = []
    nbytes = 0
    for lineno, obj in records:
        at = f"task '{spec}': {where} {row} {lineno}"
        if isinstance(obj, dict):
            missing = [k for k in allowed if k not in obj]
            extra = [k for k in obj if k not in allowed] if only_fields else []
            if extra:
                raise ValueError(
                    f"{at}: unknown key {str(extra[0])!r} (allowed: '{prompt_field}', "
                    f"'{answer_field}')"
                )
            if missing:
                raise ValueError(
                    f"{at}: missing key '{missing[0]}' (each row needs '{prompt_field}' and "
                    f"'{answer_field}'; give \"\" for an answer the reward does not use)"
                )
        prompt = obj.get(prompt_field) if isinstance(obj, dict) else None
        answer = answer_text(obj.get(answer_field)) if isinstance(obj, dict) else None
        if not isinstance(prompt, str) or answer is None:
            raise ValueError(
                f"{at}: expected an object with a string '{prompt_field}' and a string or number "
                f"'{answer_field}'"
            )
        if not prompt:  # no tokens to condition on: an IndexError in the first rollout
            raise ValueError(
                f"{at}: '{prompt_field}' is empty (a prompt needs at least one character)"
            )
        for key, text in ((prompt_field, prompt), (answer_field, answer)):
            if len(text) > limits.MAX_TEXT_CHARS:
                raise ValueError(
                    f"{at}: '{key}' is {len(text):,} characters; at most {limits.MAX_TEXT_CHARS:,}"
                )
        nbytes += _utf8_size(prompt) + _utf8_size(answer)
        if nbytes > bounds.data_bytes:
            raise ValueError(
                bounds.data_refusal(
                    f"task '{spec}': the prompts and answers of {where} up to {row} {lineno} "
                    f"hold {nbytes:,} bytes"
                )
            )
        out.append(Example(prompt=prompt, answer=answer, source=f"{where} {row} {lineno}"))
    if not out:
        raise ValueError(f"task '{spec}': {where} holds no examples")
    return out


def _utf8_size(text: str) -> int:
    # isascii() reads a flag CPython keeps on the string: only non-ASCII text is encoded.
    return len(text) if text.isascii() else len(text.encode())


def utf8_lines(spec: str, path: str, fh: BinaryIO) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a task file opened for bytes, decoded as UTF-8; a byte that is
    not UTF-8 is one error naming its line."""
    for lineno, raw in enumerate(fh, start=1):
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"task '{spec}': {path} line {lineno}: is not valid UTF-8 (byte {exc.start} "
                "of the line)"
            ) from None


def open_task_file(spec: str, path: str, bounds: limits.DataBounds) -> BinaryIO:
    """Task file ``path`` opened for bytes, refused unless it is a regular file of at most
    ``bounds.file_bytes`` (checked before it is opened: a FIFO would block the read until a
    writer came). ``~`` is expanded; a relative path is relative to the current directory."""
    p = Path(path).expanduser()
    kind = limits.not_regular(p)
    if kind is not None:
        raise ValueError(f"task '{spec}': '{path}' is {kind}, not a regular file")
    if not p.is_file():
        raise ValueError(f"task '{spec}': file '{path}' does not exist")
    try:
        return limits.open_bounded(
            p, bounds.file_bytes, "a task file", shown=path, option=bounds.file_option
        )
    except ValueError as err:
        raise ValueError(f"task '{spec}': {err}") from None


def read_jsonl(
    spec: str,
    path: str,
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    only_fields: bool = True,
    bounds: limits.DataBounds = limits.DEFAULT_DATA_BOUNDS,
) -> list[Example]:
    """Parse a JSONL file of ``{"prompt": ..., "answer": ...}`` lines (blank lines skipped; the
    two field names are configurable). ``~`` is expanded; a relative path is relative to the
    current directory.

    Bounded before parsing: at most ``bounds.file_bytes`` (by default ``MAX_TASK_FILE_BYTES``,
    harness.core.limits) and ``bounds.rows`` rows, UTF-8 line by line (a bad byte names its
    line)."""
    records: list[tuple[int, Any]] = []
    with open_task_file(spec, path, bounds) as fh:
        for lineno, line in utf8_lines(spec, path, fh):
            if not line.strip():
                continue
            if len(records) >= bounds.rows:
                raise ValueError(
                    bounds.rows_refusal(
                        f"task '{spec}': {path} holds more than {bounds.rows:,} rows"
                    )
                )
            try:
                records.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"task '{spec}': {path} line {lineno}: invalid JSON ({exc.msg})"
                ) from None
            except RecursionError:  # json nests by recursion: [[[[...]]]] deeper than Python's
                raise ValueError(
                    f"task '{spec}': {path} line {lineno}: JSON nested too deeply to read "
                    "(arrays or objects within each other past Python's recursion limit)"
                ) from None
    return pairs_from_records(
        spec,
        path,
        records,
        prompt_field=prompt_field,
        answer_field=answer_field,
        only_fields=only_fields,
        bounds=bounds,
    )


def file_digest(path: str | Path) -> str:
    """SHA-256 of a data file's bytes (a task's fingerprint)."""
    # Read in blocks: a file a run allowed past the default bound need not be held twice.
    h = hashlib.sha256()
    with Path(path).expanduser().open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
