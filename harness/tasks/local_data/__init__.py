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

from pathlib import Path
from typing import TYPE_CHECKING

from harness.core import limits
from harness.tasks.local_data.checks import FORMS, regular, text_bytes
from harness.tasks.local_data.parquet import read_parquet
from harness.tasks.local_data.saved import read_saved
from harness.tasks.pairs import PairTask, answer_options, file_task
from harness.tasks.records import file_digest, pairs_from_records, read_jsonl

if TYPE_CHECKING:
    from harness.tasks.sources.hf import HfOptions


def hf_task(spec: str, path: str, o: HfOptions) -> PairTask:
    """``hf:PATH`` (see the module docstring); ``max_*`` move the data bounds
    (:class:`harness.tasks.pairs.DataLimitOptions`). Raises a one-line ``ValueError``."""
    bounds = o.bounds()
    if not path:
        raise ValueError(f"task '{spec}': expected hf:PATH ({FORMS})")
    p = Path(path).expanduser()
    if not p.exists() and limits.not_regular(p) != "a symlink loop":
        raise ValueError(
            f"task '{spec}': '{path}' is not a local path; hf: reads {FORMS} on this machine "
            "and downloads nothing (save a hub dataset with save_to_disk first)"
        )
    scoring = answer_options(spec, o)
    fields = (o.prompt_field, o.answer_field)
    if not p.is_dir():
        regular(spec, p)
    if p.is_file() and o.split is not None:
        raise ValueError(
            f"task '{spec}': task_options.split: applies to a save_to_disk directory only"
        )
    if p.is_dir():
        where, columns, digest = read_saved(spec, p, o.split, fields, bounds)
    elif p.suffix == ".parquet":
        where, columns, digest = read_parquet(spec, p, fields, bounds)
    elif p.suffix == ".jsonl":
        # Other keys are ordinary dataset columns, ignored as in a Parquet file.
        examples = read_jsonl(
            spec,
            path,
            prompt_field=o.prompt_field,
            answer_field=o.answer_field,
            only_fields=False,
            bounds=bounds,
        )
        where, columns, digest = None, None, file_digest(p)
    else:
        raise ValueError(f"task '{spec}': '{path}' is not {FORMS}")
    if columns is not None:
        rows = zip(columns[o.prompt_field], columns[o.answer_field], strict=True)
        records = (
            (i, {o.prompt_field: a, o.answer_field: b}) for i, (a, b) in enumerate(rows, start=1)
        )
        examples = pairs_from_records(
            spec,
            str(where),
            records,
            prompt_field=o.prompt_field,
            answer_field=o.answer_field,
            row="row",
            bounds=bounds,
        )
    options = {"prompt_field": o.prompt_field, "answer_field": o.answer_field, "split": o.split}
    return file_task(spec, o, examples, scoring, digest, options)


__all__ = ["hf_task", "text_bytes"]
