"""Task files that hang, abort or mislead the loader, and careless ones: a Parquet page header
that declares 2^62 booleans, encrypted Parquet files (which Arrow, without keys, can answer with
SIGABRT), a JSONL row nested past Python's recursion limit, a truncated or 0-row Parquet file, a
prompt column named twice, and a number option written as a string.  Each is one line on stderr
naming the file (or the option) and what is wrong, exit code 2, no traceback, nothing written.

The cases that hung or killed the process before they were refused run in one child process
(the runner of ``tests/support/memory_limit.py``) under a short timeout, so a regression fails
them instead of hanging or aborting the test session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.cli import app
from tests.support import memory_limit
from tests.support.bounded import within
from tests.support.memory_limit import SMALL, assert_one_line, run_batch_under_memory_limit
from tests.tasks.parquet_thrift import (
    FILE_GROUPS,
    GROUP_COLUMNS,
    GROUP_ROWS,
    PAGE_DATA,
    PAGE_TYPE,
    rewrite_parquet,
)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FIELDS = ["--set", "task_options.prompt_field=q", "--set", "task_options.answer_field=a"]
TWO = {"q": ["1+1=", "2+2="], "a": ["2", "4"]}
FILE_ENCRYPTION = 8  # FileMetaData.encryption_algorithm (parquet.thrift)
CHUNK_CRYPTO = 8  # ColumnChunk.crypto_metadata
MAP, STRUCT = 11, 12  # compact-protocol types
CHILD_TIMEOUT_S = 240  # the child runs a dozen CLI commands; a hang stops it here


def two_rows(path: Path, **options: Any) -> Path:
    pq.write_table(pa.table(TWO), path, **options)
    return path


def map_of_bools(path: Path) -> Path:
    """Two rows whose first data page header carries an extra field (id 20): a map of booleans
    that declares 2^62 entries and holds none."""
    two_rows(path, use_dictionary=False)

    def edit(meta: dict[int, Any], groups: list[Any]) -> None:
        header = groups[0][0][0][0]
        assert header[PAGE_TYPE][1] == 0 and PAGE_DATA in header
        header[20] = (MAP, (1, 1, [], 2**62))

    return rewrite_parquet(path, edit)


def footer_marked(path: Path, where: str) -> Path:
    """An unencrypted file whose footer says it is encrypted: ``encryption_algorithm`` set in
    FileMetaData (``where="file"``), or ``crypto_metadata`` on the prompt column's chunk."""
    two_rows(path)

    def edit(meta: dict[int, Any], groups: list[Any]) -> None:
        aes_gcm_v1 = {1: (STRUCT, {})}  # a union: its first member, with no optional fields
        if where == "file":
            meta[FILE_ENCRYPTION] = (STRUCT, aes_gcm_v1)
        else:
            chunk = meta[FILE_GROUPS][1][1][0][GROUP_COLUMNS][1][1][0]
            chunk[CHUNK_CRYPTO] = (STRUCT, {1: (STRUCT, {})})  # EncryptionWithFooterKey

    return rewrite_parquet(path, edit)


def encrypted(path: Path, plaintext_footer: bool) -> Path:
    """A file pyarrow encrypts (the prompt column with its own key), keys from a stand-in KMS."""
    import base64

    pe = pytest.importorskip("pyarrow.parquet.encryption")

    class Kms(pe.KmsClient):
        def __init__(self, config: Any) -> None:
            pe.KmsClient.__init__(self)

        def wrap_key(self, key: bytes, master_key_identifier: str) -> bytes:
            return base64.b64encode(key)

        def unwrap_key(self, wrapped_key: bytes, master_key_identifier: str) -> bytes:
            return base64.b64decode(wrapped_key)

    config = pe.EncryptionConfiguration(
        footer_key="footer",
        column_keys={"column": ["q"]},
        plaintext_footer=plaintext_footer,
        double_wrapping=False,
    )
    props = pe.CryptoFactory(Kms).file_encryption_properties(pe.KmsConnectionConfig(), config)
    table = pa.table(TWO)
    with pq.ParquetWriter(path, table.schema, encryption_properties=props) as writer:
        writer.write_table(table)
    return path


def _experiment(tmp: Path, name: str, data: Path) -> Path:
    exp = tmp / f"{name}.yaml"
    base = {"task": f"hf:{data}", "task_options": {"prompt_field": "q", "answer_field": "a"}}
    exp.write_text(json.dumps({"name": name, "base": base, "grid": {"ppo.eps_clip": [0.2, 0.3]}}))
    return exp


def _commands(tmp: Path, name: str, data: Path) -> dict[str, list[str]]:
    """``harness run``, ``ablate --dry-run`` and ``export`` of a task over ``data``."""
    results = ["--results-dir", str(tmp / "results")]
    exp = _experiment(tmp, name, data)
    return {
        "run": ["run", "--set", f"task=hf:{data}", *FIELDS, *SMALL, *results],
        "ablate": ["ablate", str(exp), "--dry-run", *results],
        "export": ["export", str(exp), "--to", "trl", "--cell", "eps_clip=0.2", *results],
    }


def _child_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    cases: dict[str, tuple[list[str], str]] = {}
    hang = map_of_bools(tmp / "bools.parquet")
    why = (
        f"cannot read {hang} as Parquet (a page header of column 'q' in row group 0: a map of "
        "4,611,686,018,427,387,904 elements in "
    )
    for command, argv in _commands(tmp, "bools", hang).items():
        cases[f"map-of-2^62-bools:{command}"] = (argv, why)
    column = "its footer marks a column as encrypted"
    files = {
        "file-says-encrypted": (
            footer_marked(tmp / "file.parquet", "file"),
            "its plaintext footer names an encryption algorithm or signing key",
        ),
        "column-says-encrypted": (footer_marked(tmp / "column.parquet", "column"), column),
    }
    try:
        import pyarrow.parquet.encryption  # noqa: F401
    except ImportError:  # a pyarrow built without encryption: the hand-made files still run
        pass
    else:
        plain = encrypted(tmp / "plain.parquet", plaintext_footer=True)
        files["pyarrow-plaintext-footer"] = (plain, column)
        files["pyarrow-encrypted-footer"] = (
            encrypted(tmp / "sealed.parquet", plaintext_footer=False),
            "its footer is encrypted: it ends in PARE",
        )
    for name, (path, what) in files.items():
        expect = f"{path} is an encrypted Parquet file ({what}); hf: reads unencrypted files"
        for command, argv in _commands(tmp, name, path).items():
            if name == "pyarrow-plaintext-footer" or command == "run":
                cases[f"{name}:{command}"] = (argv, expect)
    return cases


@pytest.fixture(scope="module")
def child_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("hostile-files")
    cases = _child_cases(tmp)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(memory_limit, "BATCH_TIMEOUT_S", CHILD_TIMEOUT_S)
        batch = run_batch_under_memory_limit(
            tmp, {n: [argv, {}] for n, (argv, _) in cases.items()}, memory_check=False
        )
    return {"cases": cases, "tmp": tmp, **batch}


CHILD_CASES = [
    f"{name}:{command}"
    for name in ("map-of-2^62-bools", "pyarrow-plaintext-footer")
    for command in ("run", "ablate", "export")
] + [
    "file-says-encrypted:run",
    "column-says-encrypted:run",
    "pyarrow-encrypted-footer:run",
]


@pytest.mark.parametrize("case", CHILD_CASES)
def test_a_file_that_hung_or_aborted_is_one_line(case, child_results):
    if case not in child_results["cases"]:
        pytest.skip("pyarrow was built without Parquet encryption")
    _, expect = child_results["cases"][case]
    got = child_results["got"].get(case)
    assert got is not None, f"no result (the child hung or died here): {child_results['tail']}"
    assert got["exception"] is None, got["exception"]
    assert_one_line(got["exit_code"], got["stderr"], expect, child_results["tmp"] / "results")
    assert got["seconds"] < 60, got["seconds"]


# --- the walks themselves: every declared count is bounded by the bytes left -----------------


@pytest.mark.parametrize(
    "extra,why",
    [
        (bytes([0x0B, 0x28]) + b"\x80" * 8 + b"\x40\x11", "a map of 4,611,686,018,427,387,904"),
        (bytes([0x09, 0x28, 0xF1]) + b"\x80" * 8 + b"\x40", "a list of 4,611,686,018,427,387,904"),
        (bytes([0x09, 0x28, 0xFC]) + b"\xff\xff\xff\xff\x07", "a list of 2,147,483,647"),
    ],
    ids=["map-of-bools", "list-of-bools", "list-of-structs"],
)
def test_a_header_declaring_more_elements_than_bytes_is_refused_at_once(extra, why):
    """A data page header (type 0, sizes 2 and 2, 2 values) with one more field, id 20 (zigzag
    0x28): a collection whose count the bytes after it could never hold."""
    from harness.tasks.parquet_pages import BadHeader, page_headers

    header = bytes([0x15, 0x00, 0x15, 0x04, 0x15, 0x04, 0x2C, 0x15, 0x04, 0x00]) + extra + b"\x00"
    data = memoryview(header + b"\x00\x00")
    with within(10), pytest.raises(BadHeader) as err:
        list(page_headers(data, 0, len(data)))
    assert why in str(err.value), err.value


def test_the_footer_walk_finds_no_encryption_in_files_pyarrow_writes(tmp_path):
    """No false alarm: statistics, page indexes, v2 pages, CRCs, key-value metadata, sorting
    columns, an empty row group and a 0-row file all walk to their end."""
    from harness.tasks.parquet_pages import encryption

    table = pa.table({"q": [f"{i}+1=" for i in range(5000)], "a": list(range(5000))})
    table = table.replace_schema_metadata({"origin": "x" * 10_000})
    paths = []
    for i, options in enumerate(
        [
            {},
            {"write_page_index": True, "row_group_size": 100, "write_statistics": True},
            {"data_page_version": "2.0", "write_page_checksum": True, "compression": "zstd"},
            {"sorting_columns": [pq.SortingColumn(1)], "use_dictionary": False},
        ]
    ):
        paths.append(tmp_path / f"{i}.parquet")
        pq.write_table(table, paths[-1], **options)
    paths.append(tmp_path / "empty.parquet")
    pq.write_table(table.slice(0, 0), paths[-1])
    paths.append(tmp_path / "groups.parquet")
    with pq.ParquetWriter(paths[-1], table.schema) as writer:
        writer.write_table(table.slice(0, 0))
        writer.write_table(table)
    for path in paths:
        with within(30):
            assert encryption(memoryview(path.read_bytes())) is None, path
    assert encryption(memoryview(b"PAR1" + b"\x00" * 4 + b"PARE")) is not None


# --- careless files: one line naming the file ----------------------------------------------


def run_cli(argv: list[str], results: Path) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["run", *argv, *SMALL, "--results-dir", str(results)])
    return r.exit_code, r.stderr if r.stderr is not None else r.output


def _deep(tmp: Path) -> Path:
    nested = "[" * 100_000 + "]" * 100_000
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    lines = [json.dumps(r) for r in rows] + [
        '{"prompt": "3+3=", "answer": "6", "x": ' + nested + "}"
    ]
    path = tmp / "deep.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _deep_jsonl(tmp: Path) -> tuple[list[str], str]:
    path = _deep(tmp)
    return ["--set", f"task=jsonl:{path}"], f"{path} line 3: JSON nested too deeply to read"


def _deep_hf(tmp: Path) -> tuple[list[str], str]:
    path = _deep(tmp)
    return ["--set", f"task=hf:{path}"], f"{path} line 3: JSON nested too deeply to read"


def _deep_python(tmp: Path) -> tuple[list[str], str]:
    path = _deep(tmp)
    mod = tmp / "m.py"
    mod.write_text("def score(prompt, completion, answer):\n    return 0.0\n")
    spec = f"python:{mod}:score@{path}"
    return ["--set", f"task={spec}"], f"{path} line 3: JSON nested too deeply to read"


def _truncated(tmp: Path) -> tuple[list[str], str]:
    path = two_rows(tmp / "cut.parquet")
    path.write_bytes(path.read_bytes()[:-100])
    expect = f"task 'hf:{path}': cannot read {path} as Parquet (Parquet magic bytes not found"
    return ["--set", f"task=hf:{path}", *FIELDS], expect


def _no_rows(tmp: Path) -> tuple[list[str], str]:
    path = tmp / "none.parquet"
    pq.write_table(pa.table(TWO).slice(0, 0), path)
    return ["--set", f"task=hf:{path}", *FIELDS], f"task 'hf:{path}': {path} holds no examples"


def _prompt_twice(tmp: Path) -> tuple[list[str], str]:
    path = tmp / "twice.parquet"
    names = ["prompt", "prompt", "answer"]
    columns = [pa.array(["1+1=", "2+2="]), pa.array(["x", "y"]), pa.array(["2", "4"])]
    pq.write_table(pa.Table.from_arrays(columns, names=names), path)
    expect = (
        f"task_options.prompt_field: {path} has 2 columns named 'prompt'; a prompt or answer "
        "column must be named once"
    )
    return ["--set", f"task=hf:{path}"], expect


def _prompt_twice_saved(tmp: Path) -> tuple[list[str], str]:
    datasets = pytest.importorskip("datasets")
    ds = tmp / "ds"
    datasets.Dataset.from_dict({"prompt": ["1+1="], "answer": ["2"]}).save_to_disk(str(ds))
    columns = [pa.array(["1+1="]), pa.array(["x"]), pa.array(["2"])]
    table = pa.Table.from_arrays(columns, names=["prompt", "prompt", "answer"])
    shard = ds / "data-00000-of-00001.arrow"
    with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return ["--set", f"task=hf:{ds}"], f"{ds} has 2 columns named 'prompt'"


def _truncated_shard(tmp: Path) -> tuple[list[str], str]:
    datasets = pytest.importorskip("datasets")
    ds = tmp / "ds"
    rows = {"prompt": [f"{i}+1=" for i in range(50)], "answer": [str(i) for i in range(50)]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(ds))
    shard = ds / "data-00000-of-00001.arrow"
    shard.write_bytes(shard.read_bytes()[:100])  # cut inside its schema message
    expect = f"task 'hf:{ds}': cannot read {ds} (Expected to read "
    return ["--set", f"task=hf:{ds}"], expect


CARELESS = {
    "jsonl-nested-100k-deep": _deep_jsonl,
    "hf-jsonl-nested-100k-deep": _deep_hf,
    "python-data-nested-100k-deep": _deep_python,
    "parquet-truncated": _truncated,
    "parquet-0-rows": _no_rows,
    "parquet-prompt-column-twice": _prompt_twice,
    "saved-prompt-column-twice": _prompt_twice_saved,
    "saved-shard-truncated": _truncated_shard,
}


@pytest.mark.parametrize("case", sorted(CARELESS))
def test_a_careless_file_is_one_line_naming_it(case, tmp_path):
    argv, expect = CARELESS[case](tmp_path)
    code, err = run_cli(argv, tmp_path / "results")
    assert_one_line(code, err, expect, tmp_path / "results")


def _three_groups(path: Path) -> Path:
    table = pa.table(TWO)
    with pq.ParquetWriter(path, table.schema) as writer:
        for part in (table, table.slice(0, 0), table):
            writer.write_table(part)
    return path


def test_arrow_reads_no_page_of_a_chunk_without_values(tmp_path):
    """Why the page walk skips a chunk that declares no values (pyarrow writes one, in a row
    group of no rows, with a data page offset of 0, which the walk would read as a header): Arrow
    never reads its pages, so pages made garbage there change nothing."""
    from harness.tasks import get_task

    path = _three_groups(tmp_path / "groups.parquet")
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(g).num_rows for g in range(3)] == [2, 0, 2]
    data = bytearray(path.read_bytes())
    for i in range(2):
        col = meta.row_group(1).column(i)
        assert col.num_values == 0 and col.data_page_offset == 0
        start = col.dictionary_page_offset
        data[start : start + col.total_compressed_size] = b"\xff" * col.total_compressed_size
    path.write_bytes(bytes(data))
    task = get_task(f"hf:{path}", prompt_field="q", answer_field="a")
    rows = sorted(e.source for e in [*task.train, *task.held_out])
    assert rows == [f"{path} row {i}" for i in range(1, 5)]


def test_a_row_group_of_no_rows_whose_chunks_declare_values_is_walked(tmp_path):
    """Arrow reads the pages of a chunk that declares values, whatever its row group's rows say:
    such a chunk is walked, and its values are more than the group's 0 rows."""
    from harness.tasks import get_task

    path = two_rows(tmp_path / "lies.parquet")

    def edit(meta: dict[int, Any], groups: list[Any]) -> None:
        meta[FILE_GROUPS][1][1][0][GROUP_ROWS] = (6, 0)

    rewrite_parquet(path, edit)
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).num_values == 2
    with pytest.raises(ValueError) as err:
        get_task(f"hf:{path}", prompt_field="q", answer_field="a")
    assert str(err.value) == (
        f"task 'hf:{path}': cannot read {path} as Parquet (a page header of column 'q' in row "
        "group 0: 2 pages of 2 values for 0 rows)"
    )


# --- a number option written as a string: refused like an integer one -----------------------


@pytest.mark.parametrize(
    "setting,expect",
    [
        ('reward_timeout_s="10"', "task_options.reward_timeout_s: must be a number, not a string"),
        ('max_rows="10"', "task_options.max_rows: must be an integer, not a string; got '10'"),
        ('eval_fraction="0.2"', "task_options.eval_fraction: must be a number, not a string"),
    ],
)
def test_a_number_option_given_as_a_string_is_one_line(setting, expect, tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text(
        "def score(prompt, completion, answer):\n    return 0.0\n\n\n"
        "def examples():\n    return [{'prompt': f'{i}=', 'answer': ''} for i in range(20)]\n"
    )
    argv = ["--set", f"task=python:{mod}:score", "--set", f"task_options.{setting}"]
    code, err = run_cli(argv, tmp_path / "results")
    assert_one_line(code, err, expect, tmp_path / "results")
    assert "(write it without quotes)" in err


def test_an_exponent_yaml_leaves_as_text_is_still_a_number(tmp_path):
    """YAML 1.1 reads ``1e1`` (no dot) as a string; every number field accepts it as the number,
    and a task option does too."""
    from harness.core.configtools import check_value
    from harness.tasks import get_task

    assert check_value("1e1", float, {}, "task_options.reward_timeout_s") == 10.0
    mod = tmp_path / "m.py"
    mod.write_text(
        "def score(prompt, completion, answer):\n    return 0.0\n\n\n"
        "def examples():\n    return [{'prompt': '1=', 'answer': ''}, {'prompt': '2=', 'answer': ''}]\n"
    )
    task = get_task(f"python:{mod}:score", reward_timeout_s="1e1", eval_fraction="5e-1")
    assert task.eval_fraction == 0.5
