"""Hostile task sources and generators: memory bombs in small files, dataset directories that
point outside themselves, FIFOs and devices where a file is expected, and reasoning-gym options
that make generation explode. Each is one line on stderr, exit code 2, nothing written, before
training (or, for the pieces below the CLI, the one-line ``ValueError`` the CLI prints).

The memory bombs run in one child process under an address-space limit, through the child
runner of ``tests/config/test_hostile_input.py``, so a regression fails its case with a MemoryError
instead of taking the shared machine down.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.core import limits
from tests.support.memory_limit import SMALL, assert_one_line, run_batch_under_memory_limit

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ["--set", "task_options.prompt_field=q", "--set", "task_options.answer_field=a"]


def run_cli(argv: list[str], results: Path) -> Any:
    r = CliRunner().invoke(app, ["run", *argv, *SMALL, "--results-dir", str(results)])
    return r.exit_code, r.stderr if r.stderr is not None else r.output


def saved_dataset(path: Path, n: int = 20, shards: int = 1) -> Path:
    """A real ``save_to_disk`` directory of ``n`` rows {q, a}."""
    datasets = pytest.importorskip("datasets")
    data = {"q": [f"{i}+1=" for i in range(n)], "a": [str(i + 1) for i in range(n)]}
    datasets.Dataset.from_dict(data).save_to_disk(str(path), num_shards=shards)
    return path


def arrow_stream(path: Path, table: Any) -> Path:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return path


def set_shards(ds: Path, names: list[str]) -> None:
    state = json.loads((ds / "state.json").read_text())
    state["_data_files"] = [{"filename": n} for n in names]
    (ds / "state.json").write_text(json.dumps(state))


def dictionary_column(n: int, values: list[str], index_type: Any = None) -> Any:
    import numpy as np

    indices = pa.array(np.zeros(n, dtype=np.int8 if index_type is None else index_type))
    return pa.DictionaryArray.from_arrays(indices, pa.array(values))


# --- memory bombs: one child process under an address-space limit ----------------------------


def _bomb_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    r = ["--results-dir", str(tmp / "results")]
    rows = 20_000_000
    # 20 M rows of one dictionary word: ~1 MB on disk, gigabytes as Python strings.
    many = tmp / "many.parquet"
    pq.write_table(
        pa.table({"q": dictionary_column(rows, ["1+1="]), "a": dictionary_column(rows, ["2"])}),
        many,
        row_group_size=2_000_000,
    )
    # 1,000 rows that each decode to the same 1 MiB dictionary entry: 1 GiB of text.
    wide = tmp / "wide.parquet"
    big = ["7" * limits.MIB]
    pq.write_table(
        pa.table({"q": dictionary_column(1000, big), "a": dictionary_column(1000, ["1"])}), wide
    )
    # The same bomb as an Arrow shard of a save_to_disk directory (int8 indices: 20 MB).
    saved = saved_dataset(tmp / "saved")
    arrow_stream(
        saved / "data-00000-of-00001.arrow",
        pa.table({"q": dictionary_column(rows, ["1+1="]), "a": dictionary_column(rows, ["2"])}),
    )
    return {
        "parquet-20m-dictionary-rows": (
            ["run", "--set", f"task=hf:{many}", *FIELDS, *SMALL, *r],
            f"task 'hf:{many}': {many} holds 20,000,000 rows or more; a task's data may hold at "
            "most 1,000,000 rows",
        ),
        "parquet-1gib-of-dictionary-text": (
            ["run", "--set", f"task=hf:{wide}", *FIELDS, *SMALL, *r],
            f"the prompt and answer columns of {wide} decode to 1,048,577,000 bytes or more; a "
            "task's data may decode to at most 268,435,456 bytes (256 MiB) of text",
        ),
        "saved-arrow-20m-dictionary-rows": (
            ["run", "--set", f"task=hf:{saved}", *FIELDS, *SMALL, *r],
            f"{saved} holds 20,000,000 rows or more; a task's data may hold at most 1,000,000",
        ),
        "rg-acre-size-1e8": (
            ["run", "--set", "task=rg:acre", "--set", "task_options.size=100000000", *SMALL, *r],
            "task_options.size: must be an integer in [1, 1_000_000]; got 100000000",
        ),
        "rg-chain-sum-1e6-terms": (
            [
                "run",
                "--set",
                "task=rg:chain_sum",
                "--set",
                "task_options.min_terms=1000000",
                "--set",
                "task_options.max_terms=1000000",
                *SMALL,
                *r,
            ],
            "task_options.min_terms: must be at most 1,000 for rg:chain_sum",
        ),  # fmt: skip
    }


BOMBS = [
    "parquet-20m-dictionary-rows",
    "parquet-1gib-of-dictionary-text",
    "saved-arrow-20m-dictionary-rows",
    "rg-acre-size-1e8",
    "rg-chain-sum-1e6-terms",
]


@pytest.fixture(scope="module")
def bomb_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("bombs")
    cases = _bomb_cases(tmp)
    assert list(cases) == BOMBS
    batch = run_batch_under_memory_limit(
        tmp, {n: [argv, {}] for n, (argv, _) in cases.items()}, memory_check=False
    )
    return {"cases": cases, "tmp": tmp, **batch}


@pytest.mark.parametrize("case", BOMBS)
def test_memory_bomb_is_one_line_under_a_memory_limit(case, bomb_results):
    _, expect = bomb_results["cases"][case]
    got = bomb_results["got"].get(case)
    assert got is not None, (
        f"no result (the child died at or before this case): {bomb_results['tail']}"
    )
    assert got["exception"] is None, got["exception"]
    assert_one_line(got["exit_code"], got["stderr"], expect, bomb_results["tmp"] / "results")
    assert got["seconds"] < 120, got["seconds"]


# --- non-regular files and paths out of the dataset directory --------------------------------


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _fifo_parquet(tmp: Path) -> tuple[list[str], str]:
    f = _fifo(tmp / "x.parquet")
    return ["--set", f"task=hf:{f}", *FIELDS], f"task 'hf:{f}': {f} is a FIFO, not a regular file"


def _fifo_hf_jsonl(tmp: Path) -> tuple[list[str], str]:
    f = _fifo(tmp / "x.jsonl")
    return ["--set", f"task=hf:{f}", *FIELDS], f"{f} is a FIFO, not a regular file"


def _fifo_jsonl(tmp: Path) -> tuple[list[str], str]:
    f = _fifo(tmp / "x.jsonl")
    return ["--set", f"task=jsonl:{f}"], f"task 'jsonl:{f}': '{f}' is a FIFO, not a regular file"


def _fifo_python_data(tmp: Path) -> tuple[list[str], str]:
    f = _fifo(tmp / "x.jsonl")
    mod = tmp / "m.py"
    mod.write_text("def score(prompt, completion, answer):\n    return 0.0\n")
    return ["--set", f"task=python:{mod}:score@{f}"], f"'{f}' is a FIFO, not a regular file"


def _fifo_shard(tmp: Path) -> tuple[list[str], str]:
    ds = saved_dataset(tmp / "ds")
    shard = ds / "data-00000-of-00001.arrow"
    shard.unlink()
    _fifo(shard)
    return ["--set", f"task=hf:{ds}", *FIELDS], f"data file {shard} is a FIFO, not a regular file"


def _fifo_state(tmp: Path) -> tuple[list[str], str]:
    ds = saved_dataset(tmp / "ds")
    (ds / "state.json").unlink()
    _fifo(ds / "state.json")
    return ["--set", f"task=hf:{ds}", *FIELDS], f"{ds / 'state.json'} is a FIFO, not a regular"


def _fifo_split_index(tmp: Path) -> tuple[list[str], str]:
    ds = tmp / "dd"
    ds.mkdir()
    _fifo(ds / "dataset_dict.json")
    return ["--set", f"task=hf:{ds}", *FIELDS], f"{ds / 'dataset_dict.json'} is a FIFO"


def _device_parquet(tmp: Path) -> tuple[list[str], str]:
    link = tmp / "zero.parquet"
    link.symlink_to("/dev/zero")
    return ["--set", f"task=hf:{link}", *FIELDS], f"{link} is a character device, not a regular"


def _directory_jsonl(tmp: Path) -> tuple[list[str], str]:
    d = tmp / "d.jsonl"
    d.mkdir()
    return ["--set", f"task=jsonl:{d}"], f"'{d}' is a directory, not a regular file"


def _symlink_loop(tmp: Path) -> tuple[list[str], str]:
    a, b = tmp / "a.parquet", tmp / "b.parquet"
    a.symlink_to(b)
    b.symlink_to(a)
    return ["--set", f"task=hf:{a}", *FIELDS], f"{a} is a symlink loop, not a regular file"


def _shard_outside(tmp: Path) -> tuple[list[str], str]:
    ds = saved_dataset(tmp / "ds")
    outside = tmp / "big.arrow"
    (ds / "data-00000-of-00001.arrow").rename(outside)
    set_shards(ds, ["../big.arrow"])
    return (
        ["--set", f"task=hf:{ds}", *FIELDS],
        f"data file '../big.arrow' of {ds} resolves to {outside}, outside the dataset directory",
    )


def _shard_absolute(tmp: Path) -> tuple[list[str], str]:
    ds = saved_dataset(tmp / "ds")
    outside = tmp / "big.arrow"
    (ds / "data-00000-of-00001.arrow").rename(outside)
    set_shards(ds, [str(outside)])
    return ["--set", f"task=hf:{ds}", *FIELDS], f"resolves to {outside}, outside the dataset"


def _shard_symlink_out(tmp: Path) -> tuple[list[str], str]:
    ds = saved_dataset(tmp / "ds")
    outside = tmp / "big.arrow"
    shard = ds / "data-00000-of-00001.arrow"
    shard.rename(outside)
    shard.symlink_to(outside)
    return ["--set", f"task=hf:{ds}", *FIELDS], f"resolves to {outside}, outside the dataset"


def _split_outside(tmp: Path) -> tuple[list[str], str]:
    saved_dataset(tmp / "elsewhere")
    dd = tmp / "dd"
    dd.mkdir()
    (dd / "dataset_dict.json").write_text(json.dumps({"splits": ["../elsewhere"]}))
    return (
        ["--set", f"task=hf:{dd}", "--set", "task_options.split=../elsewhere", *FIELDS],
        f"split '../elsewhere' of {dd} resolves to {tmp / 'elsewhere'}, outside the dataset",
    )


def _many_shards(tmp: Path) -> tuple[list[str], str]:
    ds = saved_dataset(tmp / "ds")
    set_shards(ds, [f"data-{i:06d}.arrow" for i in range(5_000)])
    return (
        ["--set", f"task=hf:{ds}", *FIELDS],
        f"{ds / 'state.json'} names 5,000 data files; a dataset may have at most 1,024",
    )


def _list_column(tmp: Path) -> tuple[list[str], str]:
    ds = saved_dataset(tmp / "ds")
    table = pa.table({"q": pa.array([["1+1="] * 3] * 4), "a": pa.array(["2"] * 4)})
    arrow_stream(ds / "data-00000-of-00001.arrow", table)
    return (
        ["--set", f"task=hf:{ds}", *FIELDS],
        "task_options.prompt_field: column 'q' of ",
    )


def _view_column(tmp: Path) -> tuple[list[str], str]:
    ds = saved_dataset(tmp / "ds")
    table = pa.table({"q": pa.array(["1+1="] * 4, pa.string_view()), "a": pa.array(["2"] * 4)})
    arrow_stream(ds / "data-00000-of-00001.arrow", table)
    return ["--set", f"task=hf:{ds}", *FIELDS], "holds string_view; a prompt or answer column"


def _state_not_json(tmp: Path) -> tuple[list[str], str]:
    ds = saved_dataset(tmp / "ds")
    (ds / "state.json").write_bytes(b"\x00" * 10)
    return ["--set", f"task=hf:{ds}", *FIELDS], f"{ds / 'state.json'} is not a datasets"


def _state_over_a_mib(tmp: Path) -> tuple[list[str], str]:
    ds = saved_dataset(tmp / "ds")
    with (ds / "state.json").open("ab") as fh:
        fh.truncate(2 * limits.MIB)
    return [
        "--set",
        f"task=hf:{ds}",
        *FIELDS,
    ], "is 2,097,152 bytes; a datasets state file may be at most 1,048,576"


PATHS = {
    "fifo-as-hf-parquet": _fifo_parquet,
    "fifo-as-hf-jsonl": _fifo_hf_jsonl,
    "fifo-as-jsonl": _fifo_jsonl,
    "fifo-as-python-data": _fifo_python_data,
    "fifo-as-dataset-shard": _fifo_shard,
    "fifo-as-state-json": _fifo_state,
    "fifo-as-split-index": _fifo_split_index,
    "device-as-parquet": _device_parquet,
    "directory-as-jsonl": _directory_jsonl,
    "symlink-loop": _symlink_loop,
    "shard-named-outside": _shard_outside,
    "shard-named-absolute": _shard_absolute,
    "shard-symlinked-outside": _shard_symlink_out,
    "split-named-outside": _split_outside,
    "5k-shards": _many_shards,
    "list-prompt-column": _list_column,
    "string-view-prompt-column": _view_column,
    "state-json-not-json": _state_not_json,
    "state-json-2mib": _state_over_a_mib,
}


@pytest.mark.parametrize("case", sorted(PATHS))
def test_hostile_path_is_one_line_without_opening_it(case, tmp_path):
    argv, expect = PATHS[case](tmp_path)
    start = time.monotonic()
    code, err = run_cli(argv, tmp_path / "results")
    assert_one_line(code, err, expect, tmp_path / "results")
    assert time.monotonic() - start < 120


def test_a_shard_outside_the_directory_is_never_read(tmp_path, monkeypatch):
    """The bound applies to what is read: only files inside the directory are opened."""
    ds = saved_dataset(tmp_path / "ds")
    outside = tmp_path / "big.arrow"
    (ds / "data-00000-of-00001.arrow").rename(outside)
    set_shards(ds, ["../big.arrow"])
    opened: list[str] = []
    real = pa.memory_map
    monkeypatch.setattr(pa, "memory_map", lambda p, *a: opened.append(str(p)) or real(p, *a))
    from harness.tasks import get_task

    with pytest.raises(ValueError, match="outside the dataset directory"):
        get_task(f"hf:{ds}", prompt_field="q", answer_field="a")
    assert opened == []


def test_the_size_bound_counts_the_files_read_not_the_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = tmp_path / "ds"
    rows = {"q": [f"{i}+1=" for i in range(40)], "a": [str(i + 1) for i in range(40)]}
    # An ordinary extra column brings the shard near the 1 MiB bound set below.
    datasets.Dataset.from_dict({**rows, "pad": ["x" * 24_000] * 40}).save_to_disk(str(ds))
    shard = ds / "data-00000-of-00001.arrow"
    assert 0.85 * limits.MIB < shard.stat().st_size < limits.MIB - 4096
    (ds / "cache-unrelated.arrow").write_bytes(b"x" * limits.MIB)  # not named by state.json
    from harness.tasks import get_task

    task = get_task(f"hf:{ds}", prompt_field="q", answer_field="a", max_file_mib=1)
    assert len(task.train) + len(task.held_out) == 40
    with shard.open("ab") as fh:  # a shard over the bound is refused, naming what is read
        fh.write(b"\0" * limits.MIB)
    read = shard.stat().st_size + (ds / "dataset_info.json").stat().st_size
    with pytest.raises(ValueError) as err:
        get_task(f"hf:{ds}", prompt_field="q", answer_field="a", max_file_mib=1)
    assert str(err.value) == (
        f"task 'hf:{ds}': the data files hold {read:,} bytes; a task's data may be at most "
        "1,048,576 bytes (1 MiB; raise task_options.max_file_mib for more)"
    )


def test_saved_shards_read_in_order_match_datasets(tmp_path):
    """Reading the shards directly gives the rows datasets' load_from_disk gives, in order."""
    datasets = pytest.importorskip("datasets")
    from harness.tasks import get_task

    ds = saved_dataset(tmp_path / "ds", n=30, shards=3)
    task = get_task(f"hf:{ds}", prompt_field="q", answer_field="a")
    ref = datasets.load_from_disk(str(ds))
    rows = sorted([*task.train, *task.held_out], key=lambda e: int(e.source.split()[-1]))
    assert [(e.prompt, e.answer) for e in rows] == list(zip(ref["q"], ref["a"], strict=True))
    assert rows[0].source == f"{ds} row 1"


def test_dictionary_text_is_measured_without_expanding_it():
    from harness.tasks.local_data import text_bytes

    col = dictionary_column(10_000_000, ["abc"])
    assert text_bytes(col) == 30_000_000
    assert text_bytes(pa.chunked_array([pa.array(["ab", None]), pa.array(["çé"])])) == 6
    assert text_bytes(pa.array([1, 2])) == 16


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "python"])
def test_rows_are_bounded_in_every_file_task(kind, tmp_path):
    from harness.tasks import get_task

    rows = [{"q": f"{i}=", "a": str(i)} for i in range(11)]
    if kind == "jsonl":
        path = tmp_path / "d.jsonl"
        path.write_text(
            "".join(json.dumps({"prompt": r["q"], "answer": r["a"]}) + "\n" for r in rows)
        )
        spec, opts, expect = f"jsonl:{path}", {}, "holds more than 10 rows"
    elif kind == "parquet":
        path = tmp_path / "d.parquet"
        pq.write_table(pa.table({"q": [r["q"] for r in rows], "a": [r["a"] for r in rows]}), path)
        spec, opts, expect = (
            f"hf:{path}",
            {"prompt_field": "q", "answer_field": "a"},
            "holds 11 rows",
        )
    else:
        mod = tmp_path / "m.py"
        mod.write_text(
            "import itertools\n\ndef score(p, c, a):\n    return 0.0\n\n\n"
            "def examples():\n    return ({'prompt': f'{i}=', 'answer': ''} for i in itertools.count())\n"
        )
        spec, opts, expect = (
            f"python:{mod}:score",
            {},
            r"examples\(\) returns more than 10 examples",
        )
    with pytest.raises(ValueError, match=expect) as err:
        get_task(spec, **opts, max_rows=10)
    assert str(err.value).endswith(
        "; a task's data may hold at most 10 rows (raise task_options.max_rows for more)"
    )


# --- reasoning-gym generators ---------------------------------------------------------------

rg_factory = pytest.importorskip("reasoning_gym.factory")


@pytest.mark.parametrize(
    "sets,expect",
    [
        (["task=rg:chain_sum", "task_options.min_digits=1000000000", "task_options.max_digits=1000000000"],
         "task_options.min_digits: must be at most 100 for rg:chain_sum"),
        (["task=rg:basic_arithmetic", "task_options.max_terms=100000"],
         "task_options.max_terms: must be at most 1,000 for rg:basic_arithmetic"),
        (["task=rg:knights_knaves", "task_options.n_people=100000"],
         "task_options.n_people: must be at most 8 for rg:knights_knaves"),
        (["task=rg:countdown", "task_options.max_numbers=1000"],
         "task_options.max_numbers: must be at most 15 for rg:countdown"),
        (["task=rg:count_primes", "task_options.max_n=1000000000"],
         "task_options.max_n: must be at most 1,000,000 for rg:count_primes"),
        (["task=rg:acre", "task_options.size=6000"], "task_options.size: must be at most 5,000 for rg:acre"),
        (["task=rg:chain_sum", "task_options.size=1000001"], "task_options.size: must be an integer in [1, 1_000_000]"),
    ],
)  # fmt: skip
def test_expensive_generator_options_are_one_line(sets, expect, tmp_path):
    argv = [x for s in sets for x in ("--set", s)]
    start = time.monotonic()
    code, err = run_cli(argv, tmp_path / "results")
    assert_one_line(code, err, expect, tmp_path / "results")
    assert time.monotonic() - start < 120


def test_every_expensive_option_is_a_field_of_its_generator():
    import dataclasses

    from harness.tasks.reasoning import EXPENSIVE_OPTIONS

    for name, options in EXPENSIVE_OPTIONS.items():
        _, config_cls = rg_factory.DATASETS[name]
        fields = {f.name for f in dataclasses.fields(config_cls)}
        assert set(options) <= fields, (name, set(options) - fields)


@dataclass
class HostileConfig:
    seed: int | None = None
    size: int = 20
    mode: str = "loop"

    def validate(self) -> None:
        pass


class HostileGenerator:
    """A generator whose options make it misbehave: it loops in __init__ or per item (catching
    every exception on the way, as some real generators' retry loops do), sleeps, or returns
    a 2 MiB question."""

    def __init__(self, config: HostileConfig) -> None:
        self.config = config
        if config.mode == "build":
            self._spin()

    @staticmethod
    def _spin() -> None:
        while True:
            try:
                while True:
                    pass
            except Exception:  # noqa: S112 - a generator's own retry loop
                continue

    def __getitem__(self, idx: int) -> dict[str, Any]:
        mode = self.config.mode
        if mode == "loop":
            self._spin()
        if mode == "swallow":  # a bounded retry loop that swallows even BaseException
            for _ in range(4):
                try:
                    end = time.monotonic() + 0.5
                    while time.monotonic() < end:
                        pass
                except BaseException:  # noqa: BLE001, S112
                    continue
        if mode == "sleep":
            time.sleep(0.02)
        question = "7" * (2 * limits.MIB) if mode == "huge" else f"{idx}+1="
        return {"question": question, "answer": str(idx + 1), "metadata": {}}

    def score_answer(self, answer: str | None, entry: dict[str, Any]) -> float:
        return float(answer == entry["answer"])


@pytest.mark.parametrize(
    "mode,patch,expect",
    [
        ("build", {"TASK_BUILD_SECONDS": 0.5}, "building the hostile generator took more than 0.5 s"),
        ("loop", {"TASK_ITEM_SECONDS": 0.5}, "the generator took more than 0.5 s on item 20"),
        ("swallow", {"TASK_ITEM_SECONDS": 0.5}, "the generator took more than 0.5 s on item 20"),
        ("sleep", {"TASK_PROBE_SECONDS": 0.5}, "took more than 0.5 s; lower the options that make"),
        ("huge", {}, "hostile item 20 (seed 0): its question is 2,097,152 characters; at most 1,048,576"),
    ],
)  # fmt: skip
def test_a_generator_that_explodes_is_one_line_within_its_bound(
    mode, patch, expect, tmp_path, monkeypatch
):
    monkeypatch.setitem(rg_factory.DATASETS, "hostile", (HostileGenerator, HostileConfig))
    for key, value in patch.items():
        monkeypatch.setattr(limits, key, value)
    argv = ["--set", "task=rg:hostile", "--set", f"task_options.mode={mode}"]
    start = time.monotonic()
    code, err = run_cli(argv, tmp_path / "results")
    assert_one_line(code, err, expect, tmp_path / "results")
    assert time.monotonic() - start < 120


def test_a_slow_generator_bound_leaves_no_timer_behind(monkeypatch):
    import signal

    from harness.tasks import get_task

    monkeypatch.setitem(rg_factory.DATASETS, "hostile", (HostileGenerator, HostileConfig))
    task = get_task("rg:hostile", mode="fast")
    assert [e.prompt.split("\n")[0] for e in task.eval_examples(2)] == ["20+1=", "21+1="]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_long_prompt_without_a_template_is_not_blamed_on_the_template(tmp_path, monkeypatch):
    """Without a chat template nothing is rendered: the render bound must not fire (it named
    rollout.chat_template for a task whose prompts were merely long)."""
    from harness.config import build_run_config
    from harness.config.prompt_probe import probe_prompts
    from harness.model.build import build_tokenizer
    from harness.tasks import get_task

    monkeypatch.setattr(limits, "TEMPLATE_RENDER_SECONDS", 0.0)
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}=", "answer": "1"}) + "\n" for i in range(20))
    )
    cfg = build_run_config({"task": f"jsonl:{data}"})
    probe = probe_prompts(cfg, get_task(cfg.task), build_tokenizer())
    assert probe.longest >= 2


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors"])
def test_a_fifo_in_a_model_directory_is_refused_without_opening_it(
    name: str, qwen_dir: Path, tmp_path: Path
) -> None:
    import shutil

    model = tmp_path / "model"
    shutil.copytree(qwen_dir, model)
    assert (model / name).is_file()
    (model / name).unlink()
    os.mkfifo(model / name)
    results = tmp_path / "results"
    code, err = run_cli(["--set", f"model={model}"], results)
    assert_one_line(code, err, f"model: {model / name} is a FIFO, not a regular file", results)
