"""Task-data bounds a run can move, and Parquet files whose metadata lies about their sizes.

The bounds on rows, bytes read and decoded text (``docs/limits.md``) are ``task_options``
(``max_rows``, ``max_file_mib``, ``max_data_mib``): declared with a ceiling each, checked like
every option, and named by the refusal of a file over them.  The lying Parquet files are built
here: pyarrow writes a small honest file, and its footer and page headers (Thrift compact
structs) are decoded, edited and written back (``tests/tasks/parquet_thrift.py``), so a footer
can claim 100 bytes for a 2 GB page or 10 rows for 20 M.  The ones that would take gigabytes if
read run in one child process under an address-space limit (the runner of
``tests/config/test_hostile_input.py``).
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.core import limits
from tests.support.memory_limit import SMALL, assert_one_line, run_batch_under_memory_limit
from tests.support.tiny import TINY
from tests.tasks.parquet_thrift import (
    CHUNK_META,
    COL_STATS,
    COL_UNCOMPRESSED,
    COL_VALUES,
    FILE_GROUPS,
    FILE_ROWS,
    GROUP_COLUMNS,
    GROUP_ROWS,
    PAGE_COMPRESSED,
    PAGE_DATA,
    PAGE_UNCOMPRESSED,
    rewrite_parquet,
)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

MIB = limits.MIB
FIELDS = ["--set", "task_options.prompt_field=q", "--set", "task_options.answer_field=a"]
OPTS = {"prompt_field": "q", "answer_field": "a"}
MORE_ROWS = "(raise task_options.max_rows for more)"
MORE_TEXT = "(raise task_options.max_data_mib for more)"


def _dictionary_column(n: int, values: list[str]) -> Any:
    import numpy as np

    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int8)), pa.array(values))


def rows_lie(path: Path, rows: int, stated: int) -> Path:
    """``rows`` dictionary-encoded rows in one row group; the file's own count says ``stated``."""
    table = pa.table(
        {"q": _dictionary_column(rows, ["1+1="]), "a": _dictionary_column(rows, ["2"])}
    )
    pq.write_table(table, path, row_group_size=rows)

    def edit(meta: dict[int, Any], groups: list[Any]) -> None:
        meta[FILE_ROWS] = (6, stated)

    return rewrite_parquet(path, edit)


def huge_page_header(path: Path) -> Path:
    """Two rows whose first data page declares 2^31 - 1 bytes once decompressed."""
    pq.write_table(pa.table({"q": ["1+1=", "2+2="], "a": ["2", "4"]}), path, use_dictionary=False)

    def edit(meta: dict[int, Any], groups: list[Any]) -> None:
        groups[0][0][0][0][PAGE_UNCOMPRESSED] = (5, 2**31 - 1)

    return rewrite_parquet(path, edit)


def _gzip(parts: list[bytes], repeat: int) -> bytes:
    z = zlib.compressobj(1, zlib.DEFLATED, 31)  # the gzip container Parquet's GZIP codec reads
    return b"".join([*(z.compress(p) for _ in range(repeat) for p in parts), z.flush()])


def plain_page_footer_lie(
    path: Path, value: bytes, n: int, declared: int | None = None, answer_value: bytes = b"1"
) -> Path:
    """``n`` rows whose prompt is ``value`` (and answer ``answer_value``) each, in one GZIP page
    of PLAIN strings per column (a few KB on disk for a gigabyte); the footer claims 100 bytes
    per column, and the prompt's page header its true size unless ``declared`` is given."""
    schema = pa.schema([pa.field("q", pa.string(), False), pa.field("a", pa.string(), False)])
    table = pa.table({"q": ["x"], "a": ["1"]}, schema=schema)
    pq.write_table(table, path, use_dictionary=False, compression="GZIP")
    prompt = struct.pack("<I", len(value)) + value
    answer = struct.pack("<I", len(answer_value)) + answer_value

    def edit(meta: dict[int, Any], groups: list[Any]) -> None:
        for pages, one, size in ((groups[0][0], prompt, declared), (groups[0][1], answer, None)):
            header, _ = pages[-1]
            body = _gzip([one], n)
            header[PAGE_UNCOMPRESSED] = (5, len(one) * n if size is None else size)
            header[PAGE_COMPRESSED] = (5, len(body))
            header[PAGE_DATA][1][1] = (5, n)  # num_values
            header[PAGE_DATA][1].pop(5, None)  # statistics of the one honest value
            pages[-1][1] = body
        group = meta[FILE_GROUPS][1][1][0]
        meta[FILE_ROWS] = group[GROUP_ROWS] = (6, n)
        for chunk in group[GROUP_COLUMNS][1][1]:
            md = chunk[CHUNK_META][1]
            md[COL_VALUES], md[COL_UNCOMPRESSED] = (6, n), (6, 100)
            md.pop(COL_STATS, None)

    return rewrite_parquet(path, edit)


def test_the_rewriter_changes_only_what_it_is_told(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"q": ["1+1=", "2+2="], "a": ["2", "4"]}), path)
    rewrite_parquet(path, lambda meta, groups: None)
    assert pq.read_table(path).to_pydict() == {"q": ["1+1=", "2+2="], "a": ["2", "4"]}
    rows_lie(path, 1000, 10)
    meta = pq.ParquetFile(path).metadata
    assert (meta.num_rows, meta.row_group(0).num_rows) == (10, 1000)
    plain_page_footer_lie(path, b"7" * 1000, 3)
    meta = pq.ParquetFile(path).metadata
    assert meta.row_group(0).column(0).total_uncompressed_size == 100
    assert pq.read_table(path).to_pydict() == {"q": ["7" * 1000] * 3, "a": ["1"] * 3}


# --- lying files that would take gigabytes: one child under an address-space limit ------------


def _lie_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    r = ["--results-dir", str(tmp / "results")]
    rows = rows_lie(tmp / "rows.parquet", 20_000_000, 10)
    header = huge_page_header(tmp / "header.parquet")
    # 2,000 rows of a 1 MiB prompt and a 1 MiB answer: a 2 GB page a column, each stated in
    # its header, while the footer claims 100 bytes a column. Read, Arrow allocated the second
    # page's buffer past the 4 GB limit ("malloc of size 2097160000 failed").
    page = plain_page_footer_lie(tmp / "page.parquet", b"7" * MIB, 2000, answer_value=b"8" * MIB)
    spec = "task 'hf:{p}': "
    return {
        "footer-says-10-rows-of-20m": (
            ["run", "--set", f"task=hf:{rows}", *FIELDS, *SMALL, *r],
            spec.format(p=rows) + f"{rows} holds 20,000,000 rows or more; a task's data may hold "
            f"at most 1,000,000 rows {MORE_ROWS}",
        ),
        "page-header-declares-2gib": (
            ["run", "--set", f"task=hf:{header}", *FIELDS, *SMALL, *r],
            spec.format(p=header) + f"the pages of the prompt and answer columns of {header} "
            "declare 2,147,483,647 bytes or more once decompressed; a task's data may decode to "
            f"at most 268,435,456 bytes (256 MiB) of text {MORE_TEXT}",
        ),
        "footer-says-100-bytes-of-two-2gb-pages": (
            ["run", "--set", f"task=hf:{page}", *FIELDS, *SMALL, *r],
            spec.format(p=page) + f"the pages of the prompt and answer columns of {page} declare "
            "2,097,160,000 bytes or more once decompressed; a task's data may decode to at most "
            f"268,435,456 bytes (256 MiB) of text {MORE_TEXT}",
        ),
    }


LIES = [
    "footer-says-10-rows-of-20m",
    "page-header-declares-2gib",
    "footer-says-100-bytes-of-two-2gb-pages",
]


@pytest.fixture(scope="module")
def lie_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("lies")
    cases = _lie_cases(tmp)
    assert list(cases) == LIES
    batch = run_batch_under_memory_limit(
        tmp, {n: [argv, {}] for n, (argv, _) in cases.items()}, memory_check=False
    )
    return {"cases": cases, "tmp": tmp, **batch}


@pytest.mark.parametrize("case", LIES)
def test_a_lying_parquet_file_is_one_line_under_a_memory_limit(case, lie_results):
    _, expect = lie_results["cases"][case]
    got = lie_results["got"].get(case)
    assert got is not None, (
        f"no result (the child died at or before this case): {lie_results['tail']}"
    )
    assert got["exception"] is None, got["exception"]
    assert_one_line(got["exit_code"], got["stderr"], expect, lie_results["tmp"] / "results")
    assert got["stderr"].strip() == f"error: {expect}"
    assert got["seconds"] < 60, got["seconds"]


# --- the same lies, small: refused by their bound, let through by the option ------------------


def test_a_footer_that_understates_the_rows_is_judged_by_its_row_groups(tmp_path):
    from harness.tasks import get_task

    path = rows_lie(tmp_path / "rows.parquet", 1000, 10)
    with pytest.raises(ValueError) as err:
        get_task(f"hf:{path}", **OPTS, max_rows=999)
    assert str(err.value) == (
        f"task 'hf:{path}': {path} holds 1,000 rows or more; a task's data may hold at most 999 "
        f"rows {MORE_ROWS}"
    )
    task = get_task(f"hf:{path}", **OPTS, max_rows=1000)
    # One distinct prompt: every row is both trained on and held out.
    assert len({e.source for e in task.train}) == 1000 and task.held_out == task.train


def test_a_footer_that_understates_a_page_is_judged_by_the_page_header(tmp_path):
    from harness.tasks import get_task

    # 6 prompts of 512 KiB in one 3 MiB page; the footer claims 100 bytes a column.
    path = tmp_path / "page.parquet"
    plain_page_footer_lie(path, b"7" * (MIB // 2), 6)
    declared = 6 * (MIB // 2 + 4)
    with pytest.raises(ValueError) as err:
        get_task(f"hf:{path}", **OPTS, max_data_mib=2)
    assert str(err.value) == (
        f"task 'hf:{path}': the pages of the prompt and answer columns of {path} declare "
        f"{declared:,} bytes or more once decompressed; a task's data may decode to at most "
        f"2,097,152 bytes (2 MiB) of text {MORE_TEXT}"
    )
    task = get_task(f"hf:{path}", **OPTS, max_data_mib=4)
    assert len({e.source for e in task.train}) == 6 and task.held_out == task.train
    assert {len(e.prompt) for e in task.train} == {MIB // 2}


def test_a_page_that_inflates_past_its_header_fails_in_the_codec(tmp_path):
    """Arrow decompresses into a buffer of the declared size: 64 MiB behind a header that says
    1 MiB stop there, in one line."""
    from harness.tasks import get_task

    path = tmp_path / "inflates.parquet"
    plain_page_footer_lie(path, b"7" * MIB, 64, declared=MIB)
    with pytest.raises(ValueError) as err:
        get_task(f"hf:{path}", **OPTS)
    assert str(err.value).startswith(f"task 'hf:{path}': cannot read {path} as Parquet ("), err
    assert "\n" not in str(err.value)


def test_pages_with_more_values_than_their_row_group_are_refused(tmp_path):
    from harness.tasks import get_task

    path = rows_lie(tmp_path / "values.parquet", 1000, 10)
    group = []

    def edit(meta: dict[int, Any], groups: list[Any]) -> None:
        group.append(meta[FILE_GROUPS][1][1][0])
        group[0][GROUP_ROWS] = (6, 10)

    rewrite_parquet(path, edit)
    with pytest.raises(ValueError) as err:
        get_task(f"hf:{path}", **OPTS)
    assert str(err.value) == (
        f"task 'hf:{path}': cannot read {path} as Parquet (a page header of column 'q' in row "
        "group 0: 2 pages of 1,000 values for 10 rows)"
    )


def test_a_large_string_column_stays_a_dictionary(tmp_path, monkeypatch):
    """A dictionary-encoded large_string column is measured through its indices, as a string
    column is: 100 rows of one 64 KiB value are never expanded to 6.4 MB."""
    from harness.tasks import get_task
    from harness.tasks.local_data import checks

    value = pa.array(["7" * 65_536], pa.large_string())
    table = pa.table({"q": value.take(pa.array([0] * 100)), "a": pa.array(["1"] * 100)})
    path = tmp_path / "large.parquet"
    pq.write_table(table, path)
    assert pq.ParquetFile(path).schema_arrow.field("q").type == pa.large_string()
    seen: list[Any] = []
    real = checks.text_bytes
    monkeypatch.setattr(checks, "text_bytes", lambda col: seen.append(col.type) or real(col))
    with pytest.raises(ValueError) as err:
        get_task(f"hf:{path}", **OPTS, max_data_mib=1)
    assert str(err.value) == (
        f"task 'hf:{path}': the prompt and answer columns of {path} decode to 6,553,700 bytes or "
        f"more; a task's data may decode to at most 1,048,576 bytes (1 MiB) of text {MORE_TEXT}"
    )
    assert pa.types.is_dictionary(seen[0]), seen


def test_the_page_walk_skips_every_field_a_writer_adds(tmp_path):
    """Headers as pyarrow writes them (statistics, v2 pages, CRCs, dictionaries) are read to the
    sizes Arrow itself reports."""
    from harness.tasks.parquet_pages import DICTIONARY_PAGE, page_headers

    path = tmp_path / "w.parquet"
    table = pa.table(
        {"q": [f"{i}+1=" for i in range(50_000)], "a": [str(i) for i in range(50_000)]}
    )
    for options in (
        {},
        {"data_page_version": "2.0", "write_page_checksum": True},
        {"use_dictionary": False, "data_page_size": 4096},
    ):
        pq.write_table(table, path, **options)
        meta = pq.ParquetFile(path).metadata
        data = memoryview(path.read_bytes())
        for i in range(2):
            col = meta.row_group(0).column(i)
            start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
            pages = list(page_headers(data, start, col.total_compressed_size))
            total = sum(p.header_bytes + p.uncompressed for p in pages)
            assert total == col.total_uncompressed_size, options
            values = sum(p.num_values for p in pages if p.kind != DICTIONARY_PAGE)
            assert values == 50_000, options


# --- the options: declared, checked, reaching run, experiment and grid ----------------------


def _jsonl(path: Path, n: int, width: int = 0) -> Path:
    lines = (
        json.dumps({"prompt": f"{i}+1=" + "x" * width, "answer": str(i + 1)}) for i in range(n)
    )
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _run(argv: list[str]) -> tuple[int, str]:
    r = CliRunner().invoke(app, argv)
    return r.exit_code, r.stderr if r.stderr is not None else r.output


@pytest.mark.parametrize(
    "setting,expect",
    [
        ("max_rows=0", "task_options.max_rows: must be an integer in [1, 100_000_000]; got 0"),
        (
            "max_rows=100000001",
            "task_options.max_rows: must be an integer in [1, 100_000_000]; got 100000001",
        ),
        (
            "max_file_mib=16385",
            "task_options.max_file_mib: must be an integer in [1, 16_384]; got 16385",
        ),
        ("max_data_mib=0.5", "task_options.max_data_mib: must be an integer"),
        (
            "max_data_mib=65537",
            "task_options.max_data_mib: must be an integer in [1, 65_536]; got 65537",
        ),
    ],
)
def test_a_bound_out_of_its_range_is_one_line(setting, expect, tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", 40)
    results = tmp_path / "r"
    code, err = _run(
        [
            "run",
            "--set",
            f"task=jsonl:{data}",
            "--set",
            f"task_options.{setting}",
            "--results-dir",
            str(results),
        ]
    )
    assert_one_line(code, err, expect, results)


def test_the_cli_raises_and_lowers_the_row_bound(tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", 40)
    results = tmp_path / "r"
    base = ["run", "--set", f"task=jsonl:{data}", *SMALL, "--results-dir", str(results)]
    code, err = _run([*base, "--set", "task_options.max_rows=39"])
    expect = (
        f"task 'jsonl:{data}': {data} holds more than 39 rows; a task's data may hold at most 39 "
        f"rows {MORE_ROWS}"
    )
    assert_one_line(code, err, expect, results)
    assert err.strip() == f"error: {expect}"


@pytest.mark.parametrize("kind", ["jsonl", "csv", "python"])
def test_decoded_text_is_bounded_in_every_file_task(kind, tmp_path):
    from harness.tasks import get_task

    # 1,100 rows of ~1 KiB: 1.1 MiB of prompts.
    if kind == "csv":
        path = tmp_path / "d.csv"
        body = "".join(f"{i}+1={'x' * 1000},{i + 1}\n" for i in range(1100))
        path.write_text("prompt,answer\n" + body)
        spec, where, row = f"csv:{path}", str(path), "line"
    elif kind == "jsonl":
        path = _jsonl(tmp_path / "d.jsonl", 1100, 1000)
        spec, where, row = f"jsonl:{path}", str(path), "line"
    else:
        mod = tmp_path / "m.py"
        mod.write_text(
            "def score(p, c, a):\n    return 0.0\n\n\n"
            "def examples():\n"
            "    return [{'prompt': f'{i}+1=' + 'x' * 1000, 'answer': str(i + 1)} for i in range(1100)]\n"
        )
        spec, where, row = f"python:{mod}:score", "examples()", "item"
    with pytest.raises(ValueError) as err:
        get_task(spec, max_data_mib=1)
    told = str(err.value)
    assert told.startswith(f"task '{spec}': the prompts and answers of {where} up to {row} "), told
    assert told.endswith(
        f"; a task's data may decode to at most 1,048,576 bytes (1 MiB) of text {MORE_TEXT}"
    ), told
    task = get_task(spec, max_data_mib=2)
    assert len(task.train) + len(task.held_out) == 1100


def test_max_file_mib_without_a_file_is_refused(tmp_path):
    from harness.tasks import get_task

    mod = tmp_path / "m.py"
    mod.write_text(
        "def score(p, c, a):\n    return 0.0\n\n\ndef examples():\n"
        "    return [{'prompt': '1+1=', 'answer': '2'}]\n"
    )
    with pytest.raises(ValueError) as err:
        get_task(f"python:{mod}:score", max_file_mib=128)
    assert str(err.value) == (
        f"task 'python:{mod}:score': task_options.max_file_mib: bounds the file of "
        "python:MODULE:FUNCTION@PATH.jsonl; examples() reads no file (bound it with max_rows "
        "and max_data_mib)"
    )


def _experiment(
    tmp_path: Path, data: Path, base_options: dict[str, Any], grid: dict[str, Any]
) -> Path:
    base = {
        "task": f"jsonl:{data}",
        "task_options": base_options,
        "tiny": TINY,
        "steps": 1,
    }
    path = tmp_path / "exp.yaml"
    path.write_text(json.dumps({"name": "bounds", "base": base, "grid": grid}))
    return path


def test_an_experiment_file_and_its_grid_move_the_bounds(tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", 40)
    results = tmp_path / "r"
    dry = ["--dry-run", "--results-dir", str(results)]
    msg = f"task 'jsonl:{data}': {data} holds more than 10 rows; a task's data may hold at most 10 rows {MORE_ROWS}"

    exp = _experiment(tmp_path, data, {"max_rows": 10}, {"ppo.lr": [0.001, 0.002]})
    code, err = _run(["ablate", str(exp), *dry])
    assert_one_line(code, err, f"{exp}: base: {msg}", results)

    exp = _experiment(tmp_path, data, {}, {"task_options.max_rows": [40, 10]})
    code, err = _run(["ablate", str(exp), *dry])
    assert_one_line(
        code, err, f"{exp}: grid.task_options.max_rows: value 10 rejected: {msg}", results
    )

    exp = _experiment(tmp_path, data, {}, {"task_options.max_rows": [40, 0]})
    code, err = _run(["ablate", str(exp), *dry])
    expect = "grid.task_options.max_rows: value 0 rejected: must be an integer in [1, 100_000_000]; got 0"
    assert_one_line(code, err, expect, results)

    exp = _experiment(tmp_path, data, {"max_rows": 40}, {"task_options.max_data_mib": [1, 2]})
    r = CliRunner().invoke(app, ["ablate", str(exp), *dry])
    assert r.exit_code == 0, r.output
    assert not results.exists()
