"""Settings and inputs that once changed nothing, or the wrong thing, without a word: each now
acts as the user expects or is refused in one line on stderr (exit 2, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app


@pytest.fixture
def runner():
    return CliRunner()


def assert_refused(result, expect: str, results: Path) -> str:
    err = result.stderr if result.stderr is not None else result.output
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in (err or "")
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expect in lines[0], lines[0]
    assert not results.exists()
    return lines[0]


def _run(runner, tmp_path, *sets: str):
    results = tmp_path / "results"
    args = ["run", "experiments/run-default.yaml", "--results-dir", str(results)]
    for s in sets:
        args += ["--set", s]
    return runner.invoke(app, args), results


# --- a jsonl row must carry exactly its two keys ------------------------------------------------


@pytest.mark.parametrize(
    "row,expect",
    [
        ({"prompt": "b="}, "line 2: missing key 'answer'"),
        ({"prompt": "b=", "anwser": "b"}, "line 2: unknown key 'anwser' (allowed: 'prompt', "),
    ],
)
def test_jsonl_row_without_its_answer_is_refused(row, expect, tmp_path, runner):
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": "a=", "answer": "a"}) + "\n" + json.dumps(row) + "\n")
    result, results = _run(runner, tmp_path, f"task=jsonl:{data}")
    line = assert_refused(result, expect, results)
    assert str(data) in line


def test_hf_jsonl_ignores_other_columns_but_not_a_missing_answer(tmp_path):
    from harness.tasks import get_task

    data = tmp_path / "pairs.jsonl"
    rows = [{"q": f"{i}=", "a": str(i), "level": 3} for i in range(4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = get_task(f"hf:{data}", prompt_field="q", answer_field="a")
    assert sorted(ex.answer for ex in task.train + task.held_out) == ["0", "1", "2", "3"]
    data.write_text(data.read_text() + json.dumps({"q": "9=", "answr": "9"}) + "\n")
    with pytest.raises(ValueError, match="line 5: missing key 'a'"):
        get_task(f"hf:{data}", prompt_field="q", answer_field="a")
