"""``hf:PATH`` local datasets (save_to_disk directories, Parquet, JSONL), the ``math_verify``
answer check and the file tasks' answer options; refusals are one line, and nothing is fetched."""

import json
import sys

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.tasks import get_task
from harness.tasks.answers import math_verify_match
from tests.support.cli import invoke_run
from tests.support.docs import assert_commands_train, doc_block, harness_run_commands

datasets = pytest.importorskip("datasets")


def rows(n=20):
    return {"question": [f"{i}+1=" for i in range(n)], "solution": [i + 1 for i in range(n)]}


def saved_dict(tmp_path, n=20):
    path = tmp_path / "ds"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(rows(n)), "test": datasets.Dataset.from_dict(rows(4))}
    ).save_to_disk(str(path))
    return path


FIELDS = {"prompt_field": "question", "answer_field": "solution"}


def test_hf_reads_a_save_to_disk_directory_and_its_splits(tmp_path):
    path = saved_dict(tmp_path)
    t = get_task(f"hf:{path}", **FIELDS)
    every = sorted([*t.train, *t.held_out], key=lambda e: int(e.answer))
    assert [(e.prompt, e.answer) for e in every] == [(f"{i}+1=", str(i + 1)) for i in range(20)]
    assert t.held_out and not {e.prompt for e in t.train} & {e.prompt for e in t.held_out}
    ex = t.held_out[0]
    assert t.score(ex, f" {ex.answer} ") == 1.0 and t.score(ex, "nope") == 0.0
    assert ex.source.endswith("split 'train' row " + ex.source.rsplit(" ", 1)[1])
    test = get_task(f"hf:{path}", split="test", **FIELDS)
    assert len(test.train) + len(test.held_out) == 4
    one = tmp_path / "one"
    datasets.Dataset.from_dict(rows(6)).save_to_disk(str(one))
    single = get_task(f"hf:{one}", **FIELDS)
    assert len(single.train) + len(single.held_out) == 6
    assert get_task(f"hf:{path}", **FIELDS).fingerprint == t.fingerprint != test.fingerprint


def test_hf_reads_parquet_and_jsonl_files(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    data = rows(10)
    pq.write_table(pa.table(data), tmp_path / "qa.parquet")
    t = get_task(f"hf:{tmp_path / 'qa.parquet'}", **FIELDS)
    got = sorted((e.prompt, e.answer) for e in [*t.train, *t.held_out])
    assert got == sorted(
        (q, str(a)) for q, a in zip(data["question"], data["solution"], strict=True)
    )
    jl = tmp_path / "qa.jsonl"
    jl.write_text(
        "\n".join(
            json.dumps({"question": q, "solution": a}) for q, a in zip(*data.values(), strict=True)
        )
    )
    j = get_task(f"hf:{jl}", **FIELDS)
    assert sorted((e.prompt, e.answer) for e in [*j.train, *j.held_out]) == got
    assert {e.prompt for e in j.held_out} == {e.prompt for e in t.held_out}  # same hash split


@pytest.mark.parametrize(
    "spec,opts,expect",
    [
        ("hf:openai/gsm8k", {}, "'openai/gsm8k' is not a local path; hf: reads a save_to_disk directory, a .parquet or a .jsonl file on this machine and downloads nothing"),
        ("hf:{ds}", {"prompt_field": "q", "answer_field": "solution"}, "task_options.prompt_field: {ds} split 'train' has no column 'q' (columns: question, solution)"),
        ("hf:{ds}", {"split": "validation", **FIELDS}, "task_options.split: {ds} has no split 'validation' (splits: train, test)"),
        ("hf:{pq}", {"prompt_field": "question", "answer_field": "answer"}, "task_options.answer_field: {pq} has no column 'answer'"),
        ("hf:{pq}", {"split": "train", **FIELDS}, "task_options.split: applies to a save_to_disk directory only"),
        ("hf:{tmp}", FIELDS, "is not a save_to_disk dataset"),
        ("hf:{txt}", FIELDS, "is not a save_to_disk directory, a .parquet or a .jsonl file"),
        ("hf:{ds}", {"colour": "red"}, "unknown option(s) colour (allowed: prompt_field, answer_field, split,"),
        ("hf:{ds}", {"reward": "fuzzy", **FIELDS}, "task_options.reward: must be one of 'exact', 'numeric', 'math_verify'"),
    ],
)  # fmt: skip
def test_hf_refusals_are_one_line(spec, opts, expect, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    ds = saved_dict(tmp_path)
    pq.write_table(pa.table(rows(4)), tmp_path / "qa.parquet")
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "empty").mkdir()
    fill = {
        "ds": ds,
        "pq": tmp_path / "qa.parquet",
        "tmp": tmp_path / "empty",
        "txt": tmp_path / "notes.txt",
    }
    with pytest.raises(ValueError) as err:
        get_task(spec.format(**fill), **opts)
    msg = str(err.value)
    assert "\n" not in msg and expect.format(**fill) in msg, msg


def test_hf_remote_name_through_the_cli_is_exit_2_and_writes_nothing(tmp_path):
    r = CliRunner().invoke(
        app, ["run", "--set", "task=hf:openai/gsm8k", "--results-dir", str(tmp_path / "r")]
    )
    err = r.stderr if r.stderr is not None else r.output
    assert r.exit_code == 2 and "Traceback" not in r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "downloads nothing" in lines[0], lines
    assert not (tmp_path / "r").exists()


def test_hf_data_over_the_size_bound_is_refused(tmp_path):
    path = tmp_path / "ds"
    data = {**rows(20), "pad": ["x" * 60_000] * 20}  # an ordinary extra column: 1.2 MB
    datasets.Dataset.from_dict(data).save_to_disk(str(path))
    with pytest.raises(ValueError) as err:
        get_task(f"hf:{path}", **FIELDS, max_file_mib=1)
    size = sum(
        (path / f).stat().st_size for f in ("data-00000-of-00001.arrow", "dataset_info.json")
    )
    assert str(err.value) == (
        f"task 'hf:{path}': the data files hold {size:,} bytes; a task's data may be at most "
        "1,048,576 bytes (1 MiB; raise task_options.max_file_mib for more)"
    )
    assert len(get_task(f"hf:{path}", **FIELDS, max_file_mib=2).train) > 0


# ---------------------------------------------------------------- math_verify


@pytest.mark.parametrize(
    "gold,pred",
    [
        (r"\frac{1}{2}", "0.5"),
        ("0.5", r"\frac{1}{2}"),
        ("2", r"\boxed{2}"),
        (r"\boxed{2}", "2"),
        ("2", r"so the answer is $\boxed{2}$."),
        ("1/2", r"$\frac{2}{4}$"),
        (r"\sqrt{4}", "2"),
        ("x^2 + 1", "1 + x^2"),
        (r"\pi", r"\boxed{\pi}"),
    ],
)
def test_math_verify_agrees_on_equivalent_forms(gold, pred):
    pytest.importorskip("math_verify")
    assert math_verify_match(gold, pred) == 1.0


@pytest.mark.parametrize(
    "gold,pred",
    [
        (r"\frac{1}{2}", "0.25"),
        ("2", r"\boxed{3}"),
        ("2", "no number here"),
        ("2", ""),
        ("x^2 + 1", "x^2 - 1"),
    ],
)
def test_math_verify_rejects_wrong_answers(gold, pred):
    pytest.importorskip("math_verify")
    assert math_verify_match(gold, pred) == 0.0


def test_math_verify_bounds_cpu_time_not_the_wait_for_a_core(monkeypatch):
    """A parse that waits (as one does for a core on a loaded machine: 0.1 s of CPU took 1.1 s
    of wall beside six busy processes) still scores; one that computes past the bound scores 0
    at the bound, and leaves no timer or handler behind."""
    import signal
    import time

    mv = pytest.importorskip("math_verify")
    from harness.tasks import answers

    real = mv.parse
    monkeypatch.setattr(answers, "MATH_VERIFY_CPU_S", 0.3)

    def waits(text, **kw):
        time.sleep(0.6)  # twice the bound, in wall time only
        return real(text, **kw)

    monkeypatch.setattr(mv, "parse", waits)
    assert math_verify_match("7/2", "3.5") == 1.0

    def spins(text, **kw):
        end = time.process_time() + 60
        while time.process_time() < end:  # a runaway expression: cut at 0.3 s of CPU
            pass
        raise AssertionError("not cut")

    monkeypatch.setattr(mv, "parse", spins)
    start = time.process_time()
    assert math_verify_match("9/2", "4.5") == 0.0
    assert time.process_time() - start < 30
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGPROF) == signal.SIG_DFL


def test_math_verify_reads_a_whole_completion_as_free_text():
    pytest.importorskip("math_verify")
    assert math_verify_match("42", "so 42", answer_only=False) == 1.0
    assert math_verify_match("42", "so 42", answer_only=True) == 0.0  # read as the product s*o*42
    assert math_verify_match("3/2", r"We get $\boxed{\frac{3}{2}}$.", answer_only=False) == 1.0


def test_jsonl_rewards_and_answer_formats(tmp_path):
    pytest.importorskip("math_verify")
    data = tmp_path / "math.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"prompt": f"half of {i}?", "answer": f"\\frac{{{i}}}{{2}}"})
            for i in range(1, 11)
        )
    )
    mv = get_task(f"jsonl:{data}", reward="math_verify", answer_format="tag", format_weight=0.2)
    ex = next(e for e in [*mv.train, *mv.held_out] if e.answer == r"\frac{3}{2}")
    assert mv.score_parts(ex, "<answer>1.5</answer>") == pytest.approx((0.2, 0.8))
    assert mv.score(ex, "<answer>\\boxed{1.5}</answer>") == pytest.approx(1.0)
    assert mv.score(ex, "1.5") == 0.0  # no tag, no answer, no format credit
    assert mv.score(ex, "<answer>2</answer>") == pytest.approx(0.2)
    assert mv.demonstration(ex) == r"<answer>\frac{3}{2}</answer>"
    plain = get_task(f"jsonl:{data}")  # the default: the whole completion, exact or numeric
    assert plain.score(ex, r" \frac{3}{2} ") == 1.0 and plain.score(ex, "1.5") == 0.0
    exact = get_task(f"jsonl:{data}", reward="exact", answer_format="last_line")
    assert (
        exact.score(ex, "work\n\\frac{3}{2}") == 1.0 and exact.score(ex, "\\frac{3}{2}\nx") == 0.0
    )
    assert plain.fingerprint != mv.fingerprint
    nums = tmp_path / "n.jsonl"
    nums.write_text('{"prompt": "a", "answer": "2"}\n{"prompt": "b", "answer": "2"}\n')
    two = get_task(f"jsonl:{nums}").train[0]
    assert get_task(f"jsonl:{nums}").score(two, "2.0000000001") == 1.0  # numeric, as before
    assert get_task(f"jsonl:{nums}", reward="exact").score(two, "2.0000000001") == 0.0


def test_math_verify_missing_names_the_extra(monkeypatch, tmp_path):
    from harness.tasks import answers

    data = tmp_path / "q.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "2+2", "answer": "4"}\n')
    monkeypatch.delitem(sys.modules, "math_verify", raising=False)
    monkeypatch.setitem(sys.modules, "math_verify", None)
    answers._parsed_gold.cache_clear()
    r = invoke_run(tmp_path / "r", f"task=jsonl:{data}", "task_options.reward=math_verify")
    err = r.stderr if r.stderr is not None else r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert "needs the optional math-verify package (pip install 'harness[tasks]')" in lines[0]


# ---------------------------------------------------------------- end to end


def test_harness_run_trains_on_a_saved_dataset_through_the_cli(tmp_path, memory_tracker, tiny_run):
    path = saved_dict(tmp_path)
    tracker = memory_tracker
    r = invoke_run(
        tmp_path / "r",
        f"task=hf:{path}",
        "task_options.prompt_field=question",
        "task_options.answer_field=solution",
        *tiny_run,
    )
    assert r.exit_code == 0, r.output
    (run,) = tracker.runs.values()
    assert run.status == "FINISHED" and run.params["task"] == f"hf:{path}"
    rewards = [v for _, v in run.metrics["objective/reward"]]
    assert len(rewards) == 2 and all(0.0 <= v <= 1.0 for v in rewards)
    assert [v for _, v in run.metrics["reward/format"]] == [0.0, 0.0]
    assert [v for _, v in run.metrics["reward/correct"]] == pytest.approx(rewards)


# ---------------------------------------------------------------- docs/tasks.md's examples


def test_the_readme_hf_and_rg_examples_run_as_written(
    tmp_path, monkeypatch, memory_tracker, tiny_run
):
    pytest.importorskip("reasoning_gym")
    pytest.importorskip("math_verify")
    import runpy

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-questions.jsonl").write_text(doc_block('{"prompt"'))
    (tmp_path / "save_sums.py").write_text(doc_block("# save_sums.py"))
    runpy.run_path(str(tmp_path / "save_sums.py"))
    commands = harness_run_commands(doc_block("# hf:, rg: and math answers"))
    assert len(commands) == 4
    runs = assert_commands_train(commands, tiny_run, memory_tracker)
    assert [run.params["task"] for run in runs] == [
        "hf:my-sums",
        "rg:countdown",
        "rg:knights_knaves",
        "jsonl:my-questions.jsonl",
    ]
