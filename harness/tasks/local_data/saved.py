"""A directory written by ``datasets``' ``save_to_disk``: its split index and state file read
bounded, its Arrow shards checked to lie inside it and to declare no more than the bounds allow,
then read column by column."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from harness.core import limits
from harness.tasks import arrow_messages
from harness.tasks.local_data import checks


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
        checks.regular(spec, index)
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
        f"or state.json); hf: reads {checks.FORMS}"
    )


def _member(spec: str, base: Path, name: str, what: str) -> Path:
    """``base / name``: an existing regular file inside ``base`` (symlinks resolved)."""
    path = _inside(spec, base, name, what)
    checks.regular(spec, path, f"{what} ")
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
                checks.rows_check(spec, where, rows, bounds)
                if decompressed > bounds.data_bytes:
                    raise ValueError(
                        bounds.data_refusal(
                            f"task '{spec}': the record batches of {where} declare "
                            f"{decompressed:,} bytes or more to decompress"
                        )
                    )


def read_saved(
    spec: str,
    root: Path,
    split: str | None,
    fields: tuple[str, str],
    bounds: limits.DataBounds,
) -> Any:
    """(where, the prompt and answer columns, the files' digest) of a save_to_disk directory."""
    where_dir, where = _split_dir(spec, root, split)
    state, shards = _shards(spec, where_dir)
    read = [state, *shards]
    info = where_dir / "dataset_info.json"
    with contextlib.suppress(ValueError):  # hashed when present, as before; never needed
        read.append(_member(spec, where_dir, info.name, "info file"))
    checks.size_check(spec, read[1:], bounds)

    def batches(stack: contextlib.ExitStack) -> Any:
        _check_declared(spec, where, shards, bounds)
        for shard in shards:
            reader = pa.ipc.open_stream(stack.enter_context(pa.memory_map(str(shard))))
            checks.check_columns(spec, where, list(reader.schema.names), fields)
            checks.check_types(spec, where, reader.schema, fields)
            yield from reader

    try:
        with contextlib.ExitStack() as stack:
            columns = checks.read_batches(spec, where, batches(stack), fields, bounds)
    except pa.ArrowException as err:  # ArrowInvalid is a ValueError, too: Arrow's words alone
        raise ValueError(f"task '{spec}': cannot read {where} ({checks.first_line(err)})") from None
    except ValueError:
        raise
    except Exception as err:  # a user's files: any failure to read them is bad input
        raise ValueError(f"task '{spec}': cannot read {where} ({checks.first_line(err)})") from None
    return where, columns, _dir_digest(read, Path(os.path.realpath(root)))
