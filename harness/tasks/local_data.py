"""``hf:PATH``: prompt/answer pairs from a local dataset; nothing is ever downloaded.

``PATH`` is one of

* a directory written by ``datasets``' ``save_to_disk`` (a ``Dataset``, or a ``DatasetDict``
  whose split ``task_options.split`` names; default ``train``),
* a ``.parquet`` file,
* a ``.jsonl`` file (one JSON object per line),

with the prompt and answer columns named by ``prompt_field`` / ``answer_field`` (defaults
``prompt`` / ``answer``). Anything that is not an existing local path (a hub name such as
``openai/gsm8k``) is refused: the harness never fetches data at run time.

Bounded like ``jsonl:``: the files read (the split's Arrow files, the Parquet file) may hold at
most ``MAX_TASK_FILE_BYTES``, and each prompt and answer at most ``MAX_TEXT_CHARS``. Scoring,
the held-out split and the options ``reward``, ``answer_format``, ``format_weight``, ``think`` and
``eval_fraction`` are those of ``jsonl:`` (:mod:`harness.tasks.pairs`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from harness.tasks.pairs import (
    PairTask,
    answer_options,
    check_reference_answers,
    file_digest,
    pairs_from_records,
    read_jsonl,
)

_FORMS = "a save_to_disk directory, a .parquet or a .jsonl file"


def _size_check(spec: str, files: list[Path]) -> None:
    from harness.core.limits import MAX_TASK_FILE_BYTES, MIB

    total = sum(f.stat().st_size for f in files)
    if total > MAX_TASK_FILE_BYTES:
        raise ValueError(
            f"task '{spec}': the data files hold {total:,} bytes; a task's data may be at most "
            f"{MAX_TASK_FILE_BYTES:,} bytes ({MAX_TASK_FILE_BYTES // MIB} MiB)"
        )


def _check_columns(spec: str, where: str, columns: list[str], fields: tuple[str, str]) -> None:
    names = ("prompt_field", "answer_field")
    for name, col in zip(names, fields, strict=True):
        if col not in columns:
            raise ValueError(
                f"task '{spec}': task_options.{name}: {where} has no column '{col}' "
                f"(columns: {', '.join(columns) or 'none'})"
            )


def _split_dir(spec: str, root: Path, split: str | None) -> tuple[Path, str]:
    """(directory of the chosen dataset, its name in messages) of a save_to_disk directory."""
    if (root / "dataset_dict.json").is_file():
        try:
            splits = json.loads((root / "dataset_dict.json").read_text())["splits"]
        except (OSError, ValueError, KeyError, TypeError):
            raise ValueError(
                f"task '{spec}': {root}/dataset_dict.json is not a datasets split index"
            ) from None
        chosen = split if split is not None else "train"
        if chosen not in splits:
            raise ValueError(
                f"task '{spec}': task_options.split: {root} has no split '{chosen}' (splits: "
                f"{', '.join(map(str, splits))})"
            )
        return root / chosen, f"{root} split '{chosen}'"
    if (root / "state.json").is_file():
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


def _dir_digest(files: list[Path], base: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(f.relative_to(base)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _read_saved(spec: str, root: Path, split: str | None, fields: tuple[str, str]) -> Any:
    where_dir, where = _split_dir(spec, root, split)
    files = [f for f in where_dir.iterdir() if f.is_file()]
    _size_check(spec, files)
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"task '{spec}': reading a dataset directory needs the datasets package"
        ) from None
    try:
        ds = datasets.load_from_disk(str(where_dir))
    except Exception as err:  # a user's files: any failure to read them is bad input
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"task '{spec}': cannot read {where} ({first})") from None
    _check_columns(spec, where, list(ds.column_names), fields)
    columns = {c: ds[c] for c in fields}
    return where, columns, _dir_digest(files, root)


def _read_parquet(spec: str, path: Path, fields: tuple[str, str]) -> Any:
    _size_check(spec, [path])
    import pyarrow.parquet as pq

    try:
        names = list(pq.ParquetFile(path).schema_arrow.names)
        _check_columns(spec, str(path), names, fields)
        table = pq.read_table(path, columns=sorted(set(fields)))
    except ValueError:
        raise
    except Exception as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"task '{spec}': cannot read {path} as Parquet ({first})") from None
    columns = {c: table.column(c).to_pylist() for c in fields}
    return str(path), columns, file_digest(path)


def hf_task(
    spec: str,
    path: str,
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    split: str | None = None,
    eval_fraction: float = 0.1,
    reward: str = "numeric",
    answer_format: str = "raw",
    format_weight: float = 0.0,
    think: bool = False,
) -> PairTask:
    """``hf:PATH`` (see the module docstring). Raises a one-line ``ValueError``."""
    if not path:
        raise ValueError(f"task '{spec}': expected hf:PATH ({_FORMS})")
    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(
            f"task '{spec}': '{path}' is not a local path; hf: reads {_FORMS} on this machine "
            "and downloads nothing (save a hub dataset with save_to_disk first)"
        )
    scorer, answer_spec, changed = answer_options(spec, reward, answer_format, format_weight, think)
    fields = (prompt_field, answer_field)
    if p.is_file() and split is not None:
        raise ValueError(
            f"task '{spec}': task_options.split: applies to a save_to_disk directory only"
        )
    if p.is_dir():
        where, columns, digest = _read_saved(spec, p, split, fields)
    elif p.suffix == ".parquet":
        where, columns, digest = _read_parquet(spec, p, fields)
    elif p.suffix == ".jsonl":
        # Other keys are ordinary dataset columns, ignored as in a Parquet file.
        examples = read_jsonl(
            spec, path, prompt_field=prompt_field, answer_field=answer_field, only_fields=False
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
