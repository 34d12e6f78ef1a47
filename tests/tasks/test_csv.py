"""``csv:PATH``: rows read and scored as ``jsonl:``, a two-step run, a grid axis, and every bad
file refused with one line naming the file and the line, exit code 2, nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.cli import app
from harness.core import limits
from harness.tasks import get_task

SUMS = "prompt,answer\n" + "".join(f"{a}+{b}=,{a + b}\n" for a in range(5) for b in range(4))


def write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    return path


def test_rows_quoting_and_scoring(tmp_path):
    text = (
        "\ufeffanswer , prompt\r\n"  # Excel's byte-order mark, CRLF, columns in either order
        '15,"7+8="\r\n'
        "\r\n"  # a blank line is skipped
        '"a, b","say ""a, b"":"\r\n'  # a comma and quotes inside quoted fields
        ',"empty answer, on purpose="\r\n'
        '3,"1+\n2="\r\n'  # a line break inside a quoted field: the row is named by its first line
    )
    path = write(tmp_path / "q.csv", text)
    task = get_task(f"csv:{path}")
    rows = sorted((e.prompt, e.answer, e.source) for e in [*task.train, *task.held_out])
    assert rows == [
        ("1+\n2=", "3", f"{path} line 6"),
        ("7+8=", "15", f"{path} line 2"),
        ("empty answer, on purpose=", "", f"{path} line 5"),
        ('say "a, b":', "a, b", f"{path} line 4"),
    ]
    assert task.held_out and not {e.prompt for e in task.train} & {e.prompt for e in task.held_out}
    seven = next(e for e in [*task.train, *task.held_out] if e.prompt == "7+8=")
    assert task.score(seven, " 15.0 ") == 1.0 and task.score(seven, "16") == 0.0  # numeric
    exact = get_task(f"csv:{path}", reward="exact")
    assert exact.score(seven, "15.0") == 0.0 and exact.score(seven, "15") == 1.0
    tagged = get_task(f"csv:{path}", answer_format="tag", format_weight=0.5)
    assert tagged.score(seven, "<answer>15</answer>") == 1.0
    assert tagged.score(seven, "<answer>16</answer>") == 0.5
    # the data is part of the fingerprint (a warm-start cache key); the same file, the same key
    assert get_task(f"csv:{path}").fingerprint == task.fingerprint != exact.fingerprint
    write(path, text.replace("15,", "16,"))
    assert get_task(f"csv:{path}").fingerprint != task.fingerprint


def test_a_run_trains_two_steps_on_a_csv_task(tmp_path, runner, memory_tracker, tiny_run):
    path = write(tmp_path / "sums.csv", SUMS)
    args = ["run", "--results-dir", str(tmp_path / "r")]
    for s in [f"task=csv:{path}", "task_options.eval_fraction=0.25", *tiny_run]:
        args += ["--set", s]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    (run,) = memory_tracker.runs.values()
    assert run.status == "FINISHED" and run.params["task"] == f"csv:{path}"
    rewards = [v for _, v in run.metrics["objective/reward"]]
    assert len(rewards) == 2 and all(0.0 <= v <= 1.0 for v in rewards)


def test_a_grid_axis_of_task_sources(tmp_path, runner):
    good = write(tmp_path / "sums.csv", SUMS)
    bad = write(tmp_path / "bad.csv", "prompt,anwser\n1+1=,2\n")
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "name: csv-axis\nbase: {steps: 1}\nseeds: 1\n"
        f"grid:\n  task: [reverse, 'csv:{good}', 'jsonl:{tmp_path / 'x.jsonl'}']\n"
    )
    (tmp_path / "x.jsonl").write_text('{"prompt": "1+1=", "answer": 2}\n')
    r = runner.invoke(app, ["ablate", str(exp), "--dry-run", "--results-dir", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    # the cell column may cut a long path short: its start is enough
    assert f"task=csv:{str(good)[:30]}" in r.output and "3 cells" in r.output, r.output
    assert not (tmp_path / "r").exists()
    exp.write_text(
        f"name: csv-axis\nbase: {{steps: 1}}\nseeds: 1\ngrid:\n  task: [reverse, 'csv:{bad}']\n"
    )
    r = runner.invoke(app, ["ablate", str(exp), "--dry-run", "--results-dir", str(tmp_path / "r")])
    err = r.stderr if r.stderr is not None else r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert f"{bad} line 1: unknown column 'anwser'" in lines[0], lines[0]
    assert not (tmp_path / "r").exists()


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _sparse(path: Path, size: int) -> Path:
    with path.open("wb") as fh:  # no disk and no time: a hole
        fh.truncate(size)
    return path


BAD = {
    "missing column": ("prompt\n1+1=\n", "line 1: missing column 'answer'"),
    "unknown column": ("prompt,answer,anwser\n1,2,3\n", "line 1: unknown column 'anwser' (allowed"),
    "column twice": ("prompt,answer,prompt\n", "line 1: column 'prompt' appears twice"),
    "empty file": ("", "is empty (expected the header row prompt,answer)"),
    "blank lines only": ("\n\n  \n", "is empty (expected the header row prompt,answer)"),
    "header only": ("prompt,answer\n", "holds no examples"),
    "a row too wide": ("prompt,answer\n1+1=,2\n2+2=,4,extra\n", "line 3: 3 field(s); the header"),
    "a row too short": ("prompt,answer\n\n1+1=\n", "line 3: 1 field(s); the header has 2"),
    "empty prompt": ("prompt,answer\n1+1=,2\n,3\n", "line 3: 'prompt' is empty"),
    "bad quoting": ('prompt,answer\n"1+1"=,2\n', "line 2: ',' expected after '\"'"),
    "not UTF-8": (b"prompt,answer\n1+1=,2\n\xff=,3\n", "line 3: is not valid UTF-8"),
    "a FIFO": (_fifo, "is a FIFO, not a regular file"),
    "a directory": (Path.mkdir, "is a directory, not a regular file"),
    "too large": (
        lambda p: _sparse(p, limits.MAX_TASK_FILE_BYTES + 1),
        f"a task file may be at most {limits.MAX_TASK_FILE_BYTES:,} bytes (64 MiB; raise "
        "task_options.max_file_mib for more)",
    ),
    "missing file": (None, "does not exist"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_csv_file_is_one_line_naming_it(case, tmp_path, runner, assert_one_line_error):
    content, expect = BAD[case]
    path = tmp_path / "data.csv"
    if isinstance(content, str | bytes):
        write(path, content)
    elif content is not None:
        content(path)
    results = tmp_path / "r"
    r = runner.invoke(app, ["run", "--set", f"task=csv:{path}", "--results-dir", str(results)])
    assert_one_line_error(r, f"task 'csv:{path}': ")
    told = r.stderr.split(f"task 'csv:{path}': ", 1)[1]  # after the spec: the file, then why
    assert str(path) in told and expect in told, told
    assert not results.exists()


def test_a_field_over_the_text_bound_names_its_column(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_TEXT_CHARS", 50)
    path = write(tmp_path / "long.csv", f"prompt,answer\n1+1=,2\n{'x' * 50}=,3\n")
    with pytest.raises(ValueError) as err:
        get_task(f"csv:{path}")
    assert str(err.value) == (
        f"task 'csv:{path}': {path} line 3: 'prompt' is 51 characters; at most 50"
    )
    write(path, f"prompt,answer\n1+1=,2\n4+4=,{'9' * 5000}\n")  # refused while being read
    with pytest.raises(ValueError) as err:
        get_task(f"csv:{path}")
    assert str(err.value) == (
        f"task 'csv:{path}': {path} line 3: a field holds more than 50 characters; a prompt or "
        "answer may hold at most 50"
    )


def test_rows_over_the_row_bound_are_refused(tmp_path):
    path = write(tmp_path / "rows.csv", SUMS)
    with pytest.raises(ValueError) as err:
        get_task(f"csv:{path}", max_rows=3)
    assert str(err.value) == (
        f"task 'csv:{path}': {path} holds more than 3 rows; a task's data may hold at most 3 "
        "rows (raise task_options.max_rows for more)"
    )
    assert len(get_task(f"csv:{path}", max_rows=20).train) > 0  # exactly 20 rows: at the bound


@pytest.mark.parametrize(
    "sets,expect",
    [
        (["task_options.think=maybe"], "task_options.think: must be"),
        (["task_options.split=train"], "unknown option(s) split (allowed: eval_fraction, reward,"),
    ],
)
def test_bad_csv_options_are_one_line(sets, expect, tmp_path, runner, assert_one_line_error):
    path = write(tmp_path / "capitals.csv", "prompt,answer\nFrance?,Paris\nSpain?,Madrid\n")
    args = ["run", "--set", f"task=csv:{path}", "--results-dir", str(tmp_path / "r")]
    for s in sets:
        args += ["--set", s]
    assert_one_line_error(runner.invoke(app, args), expect)
    assert not (tmp_path / "r").exists()


def test_math_verify_on_answers_that_are_not_math_is_refused(tmp_path):
    pytest.importorskip("math_verify")
    path = write(tmp_path / "capitals.csv", "prompt,answer\nFrance?,Paris\nSpain?,Madrid\n")
    with pytest.raises(ValueError, match=r"math_verify scores 2 of 2 checked reference answers"):
        get_task(f"csv:{path}", reward="math_verify")


def test_the_docs_example_builds_as_written(tmp_path):
    page = (Path(__file__).resolve().parents[2] / "docs" / "tasks.md").read_text()
    block = page.split("```csv\n", 1)[1].split("```", 1)[0]
    path = write(tmp_path / "my-questions.csv", block)
    task = get_task(f"csv:{path}", reward="exact")
    rows = {e.prompt: e.answer for e in [*task.train, *task.held_out]}
    assert rows == {"2+3=": "5", "7+8=": "15", "a list: 1, 2, 3. Its sum=": "6"}


def test_a_spec_without_a_path_is_refused():
    with pytest.raises(ValueError, match=r"^task 'csv:': expected csv:PATH$"):
        get_task("csv:", reward="fuzzy")  # the missing path is named before any option
