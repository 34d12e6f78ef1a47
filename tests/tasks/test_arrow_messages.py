"""Arrow IPC shards of a ``save_to_disk`` directory written with body compression: what their
record batches declare is read before Arrow decodes one, so a few kilobytes of ZSTD that
declare gigabytes to decompress are refused in one line instead of being allocated.

The declared numbers are checked against what pyarrow itself decodes from honest streams
(uncompressed, ZSTD, LZ4); the lies are honest streams with one declared size rewritten.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from harness.tasks import get_task
from harness.tasks.arrow_messages import RECORD_BATCH, BadMessage, declared

pa = pytest.importorskip("pyarrow")

OPTS = {"prompt_field": "q", "answer_field": "a"}
SHARD = "data-00000-of-00001.arrow"


def write_stream(path: Path, table: Any, compression: str | None, chunk: int | None = None) -> Path:
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with (
        pa.OSFile(str(path), "wb") as sink,
        pa.ipc.new_stream(sink, table.schema, options=options) as w,
    ):
        w.write_table(table, max_chunksize=chunk)
    return path


def saved_dir(path: Path, table: Any, compression: str | None) -> Path:
    """A ``save_to_disk``-shaped directory (state.json naming one shard) over ``table``."""
    path.mkdir()
    (path / "state.json").write_text(json.dumps({"_data_files": [{"filename": SHARD}]}))
    write_stream(path / SHARD, table, compression)
    return path


def messages(path: Path) -> list[Any]:
    return list(pa.ipc.MessageReader.open_stream(pa.memory_map(str(path))))


def qa(n: int) -> Any:
    return pa.table({"q": [f"{i}+1=" for i in range(n)], "a": [str(i + 1) for i in range(n)]})


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
def test_declared_rows_and_sizes_are_what_arrow_decodes(tmp_path, compression):
    table = pa.table(
        {
            "q": pa.array([f"prompt {i}" * (i % 5) for i in range(5000)]),
            "n": pa.array(range(5000), pa.int64()),
            "d": pa.DictionaryArray.from_arrays(
                pa.array([i % 3 for i in range(5000)], pa.int8()), pa.array(["x", "yy", "zzz"])
            ),
        }
    )
    path = write_stream(tmp_path / "s.arrow", table, compression, chunk=1200)
    got = [declared(memoryview(m.metadata), memoryview(m.body)) for m in messages(path)]
    batches = list(pa.ipc.open_stream(pa.memory_map(str(path))))
    assert [g.rows for g in got if g.kind == RECORD_BATCH] == [b.num_rows for b in batches]
    assert [b.num_rows for b in batches] == [1200, 1200, 1200, 1200, 200]
    if compression is None:
        assert all(g.decompressed == 0 for g in got)  # read in place from the memory map
        return
    for g, batch in zip([g for g in got if g.kind == RECORD_BATCH], batches, strict=True):
        # Every buffer Arrow allocates to decompress the batch (the dictionary's values come in
        # their own message): validity, offsets and data of q, validity and values of n, the
        # int8 indices of d.
        sizes = [
            buf.size
            for name in ("q", "n")
            for buf in batch.column(name).buffers()
            if buf is not None
        ] + [batch.column("d").indices.buffers()[1].size]
        assert g.decompressed == sum(sizes)
    (dictionary,) = [g for g in got if g.kind == 2]
    assert dictionary.decompressed == 4 * 4 + len("xyyzzz")  # four int32 offsets, the text


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_an_honest_compressed_shard_is_read(tmp_path, compression):
    ds = saved_dir(tmp_path / "ds", qa(300), compression)
    task = get_task(f"hf:{ds}", **OPTS, max_rows=300)
    assert len({e.source for e in task.train} | {e.source for e in task.held_out}) == 300


def _rewrite_first_compressed_size(path: Path, size: int) -> None:
    """Rewrite the decompressed length that the first record batch's first non-empty buffer
    declares (the int64 before its compressed bytes) in ``path``."""
    data = bytearray(path.read_bytes())
    offset = 0
    for m in messages(path):
        # Each message: 0xFFFFFFFF, the metadata length, the metadata (padded), then the body.
        meta_len = struct.unpack_from("<i", data, offset + 4)[0]
        body_at = offset + 8 + meta_len
        if m.type == "record batch":
            meta = m.metadata.to_pybytes()
            root = struct.unpack_from("<I", meta, 0)[0]
            vtable = root - struct.unpack_from("<i", meta, root)[0]
            header = root + struct.unpack_from("<H", meta, vtable + 4 + 2 * 2)[0]
            batch = header + struct.unpack_from("<I", meta, header)[0]
            bvt = batch - struct.unpack_from("<i", meta, batch)[0]
            vec_at = batch + struct.unpack_from("<H", meta, bvt + 4 + 2 * 2)[0]
            vec = vec_at + struct.unpack_from("<I", meta, vec_at)[0]
            for i in range(struct.unpack_from("<I", meta, vec)[0]):
                buf_off, buf_len = struct.unpack_from("<qq", meta, vec + 4 + 16 * i)
                if buf_len:
                    struct.pack_into("<q", data, body_at + buf_off, size)
                    path.write_bytes(bytes(data))
                    return
        offset = body_at + m.body.size if m.body is not None else body_at
    raise AssertionError("no compressed buffer found")


def test_a_shard_declaring_a_terabyte_to_decompress_is_refused_before_decoding(tmp_path):
    ds = saved_dir(tmp_path / "ds", qa(40), "zstd")
    _rewrite_first_compressed_size(ds / SHARD, 2**40)
    (m,) = [m for m in messages(ds / SHARD) if m.type == "record batch"]
    assert declared(memoryview(m.metadata), memoryview(m.body)).decompressed >= 2**40
    with pytest.raises(ValueError) as err:
        get_task(f"hf:{ds}", **OPTS)
    assert str(err.value).startswith(
        f"task 'hf:{ds}': the record batches of {ds} declare 1,099,511,6"
    ), str(err.value)
    assert str(err.value).endswith("(raise task_options.max_data_mib for more)"), str(err.value)


def test_compressed_rows_past_the_bound_are_refused_from_the_declaration(tmp_path):
    # 2 M empty strings: a few KB of ZSTD, 16 MB of offsets once decoded.
    empty = pa.array([""] * 2_000_000)
    ds = saved_dir(tmp_path / "ds", pa.table({"q": empty, "a": empty}), "zstd")
    assert (ds / SHARD).stat().st_size < 64 * 1024
    with pytest.raises(ValueError) as err:
        get_task(f"hf:{ds}", **OPTS)
    assert str(err.value) == (
        f"task 'hf:{ds}': {ds} holds 2,000,000 rows or more; a task's data may hold at most "
        "1,000,000 rows (raise task_options.max_rows for more)"
    )


def test_metadata_cut_short_is_a_bad_message_and_one_line(tmp_path):
    path = write_stream(tmp_path / "s.arrow", qa(10), "zstd")
    (m,) = [m for m in messages(path) if m.type == "record batch"]
    meta = m.metadata.to_pybytes()
    with pytest.raises(BadMessage, match="cut short"):
        declared(meta[:12], memoryview(m.body))
    with pytest.raises(BadMessage, match="outside the message body"):
        declared(meta, b"")
