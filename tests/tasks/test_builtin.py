"""Reward tasks: deterministic prompts, disjoint held-out sets, exact scores, clear errors."""

from __future__ import annotations

import json
import random
import textwrap

import pytest

from harness.tasks import TASK_NAMES, Example, Task, get_task, is_held_out, position_credit


def test_registry_names():
    assert TASK_NAMES == ("reverse", "add", "sort", "mixed-scale")
    for name in TASK_NAMES:
        task = get_task(name)
        assert isinstance(task, Task) and task.name == name


@pytest.mark.parametrize("name", TASK_NAMES)
def test_sampling_and_eval_are_deterministic_and_disjoint(name):
    task = get_task(name)
    a = task.sample(random.Random(3), 50)
    assert a == task.sample(random.Random(3), 50)
    assert a != task.sample(random.Random(4), 50)
    ev = task.eval_examples(40)
    assert len(ev) == 40 and len(set(ev)) == 40
    assert ev == task.eval_examples(40) and ev[:10] == task.eval_examples(10)
    train_prompts = {ex.prompt for ex in task.sample(random.Random(0), 20_000)}
    assert not train_prompts & {ex.prompt for ex in ev}
    for ex in a + ev:
        assert ex.prompt.endswith("=")
        demo = task.demonstration(ex)
        assert len(demo) + 1 <= task.max_new_tokens_hint
        assert task.score(ex, demo) == max(task.score(ex, demo), 1.0)  # the best score


def test_held_out_rule_is_a_fixed_hash_subset():
    held = [k for k in (f"{i:03d}" for i in range(1000)) if is_held_out("reverse", k)]
    assert 60 < len(held) < 140  # about 10% of the space
    ev = get_task("reverse", min_len=3, max_len=3).eval_examples(1000)
    assert sorted(ex.prompt[4:-1] for ex in ev) == held  # all of it, and only it


def test_reverse_and_sort_partial_credit():
    rev = get_task("reverse")
    ex = Example("rev 123=", "321", "reverse")
    assert rev.score(ex, "321") == 1.0
    assert rev.score(ex, "  321 \n") == 1.0
    assert rev.score(ex, "329") == pytest.approx(2 / 3)
    assert rev.score(ex, "3210") == pytest.approx(3 / 4)  # extra characters cost credit
    assert rev.score(ex, "") == 0.0
    assert rev.score(ex, "123") == pytest.approx(1 / 3)
    srt = get_task("sort", min_len=4, max_len=4)
    ex = srt.sample(random.Random(0), 1)[0]
    digits = ex.prompt[len("sort ") : -1]
    assert len(digits) == 4 and ex.answer == "".join(sorted(digits))
    assert position_credit("0123", "0124") == 0.75


def test_add_is_exact_match():
    add = get_task("add", max_operand=9)
    for ex in add.sample(random.Random(1), 30):
        a, b = ex.prompt[:-1].split("+")
        assert 0 <= int(a) <= 9 and 0 <= int(b) <= 9 and ex.answer == str(int(a) + int(b))
    ex = Example("2+3=", "5", "add")
    assert add.score(ex, " 5") == 1.0
    assert add.score(ex, "05") == 0.0 and add.score(ex, "6") == 0.0
    assert len(add.eval_examples(1000)) < 100  # a 100-pair space holds ~10 held-out pairs


def test_mixed_scale_rewards_differ_tenfold():
    task = get_task("mixed-scale")
    train = task.sample(random.Random(0), 400)
    groups = [ex.group for ex in train]
    assert 150 < groups.count("add") < 250 and set(groups) == {"add", "reverse"}
    ev = task.eval_examples(6)
    assert [ex.group for ex in ev] == ["reverse", "add"] * 3
    rev, add = ev[0], ev[1]
    assert task.score(add, add.answer) == 10.0 and task.score(add, "x") == 0.0
    assert task.score(rev, rev.answer) == 1.0
    assert 0.0 < task.score(rev, rev.answer[:-1] + "x") < 1.0
    # The same held-out keys as the stand-alone tasks: evaluation is comparable.
    assert rev in get_task("reverse").eval_examples(10)


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_split_and_scoring(tmp_path):
    rows = [json.dumps({"prompt": f"q{i}=", "answer": i / 2}) for i in range(40)]
    rows += ["", json.dumps({"prompt": "q0=", "answer": "0.0"})]  # blank line, duplicate prompt
    path = _write(tmp_path / "d.jsonl", rows)
    task = get_task(f"jsonl:{path}")
    assert task.name == f"jsonl:{path}"
    ev = task.eval_examples(100)
    assert len({ex.prompt for ex in ev}) == 4  # 10% of 40 distinct prompts
    train = task.sample(random.Random(0), 2000)
    assert not {ex.prompt for ex in train} & {ex.prompt for ex in ev}
    assert len({ex.prompt for ex in train}) == 36
    assert get_task(f"jsonl:{path}", eval_fraction=0.25).eval_examples(100) != ev
    ex = Example("q=", "3")
    assert task.score(ex, "3") == 1.0 and task.score(ex, " 3.0000000001 ") == 1.0
    assert task.score(ex, "3.01") == 0.0 and task.score(ex, "three") == 0.0
    assert task.score(Example("q=", "abc"), "abc") == 1.0
    assert task.score(Example("q=", "nan"), "nan") == 1.0  # exact text still matches
    assert task.score(Example("q=", "inf"), "1e999") == 0.0
    assert task.demonstration(ex) == "3"


def test_jsonl_errors(tmp_path):
    with pytest.raises(
        ValueError, match=r"task 'jsonl:nope.jsonl': file 'nope.jsonl' does not exist"
    ):
        get_task("jsonl:nope.jsonl")
    bad = _write(tmp_path / "bad.jsonl", ['{"prompt": "a=", "answer": "1"}', "", "{oops"])
    with pytest.raises(ValueError, match=r"bad.jsonl line 3: invalid JSON"):
        get_task(f"jsonl:{bad}")
    keys = _write(tmp_path / "keys.jsonl", ['{"prompt": "a=", "answer": "1"}', '{"question": "b"}'])
    with pytest.raises(ValueError, match=r"keys.jsonl line 2: unknown key .question."):
        get_task(f"jsonl:{keys}")
    empty = _write(tmp_path / "empty.jsonl", [""])
    with pytest.raises(ValueError, match="holds no examples"):
        get_task(f"jsonl:{empty}")


def test_python_task_with_examples_function(tmp_path, monkeypatch):
    (tmp_path / "my_reward.py").write_text(
        textwrap.dedent(
            """
            def examples():
                return [{"prompt": f"say {i}=", "answer": str(i)} for i in range(30)]

            def reward(prompt, completion, answer):
                return 2.0 if completion == answer else -1.0
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    task = get_task("python:my_reward:reward")
    ev = task.eval_examples(10)
    assert len(ev) == 3
    assert task.score(ev[0], f" {ev[0].answer}\n") == 2.0  # completion is stripped first
    assert task.score(ev[0], "nope") == -1.0
    assert not {e.prompt for e in task.sample(random.Random(0), 500)} & {e.prompt for e in ev}


def test_python_task_from_file_with_jsonl_data(tmp_path):
    script = tmp_path / "score.py"
    script.write_text("def f(prompt, completion, answer):\n    return float(len(completion))\n")
    data = _write(tmp_path / "data.jsonl", [json.dumps({"prompt": "p=", "answer": "x"})])
    task = get_task(f"python:{script}:f@{data}")
    ex = task.sample(random.Random(0), 1)[0]
    assert ex == Example("p=", "x") and task.eval_examples(5) == [ex]  # one prompt: shared
    assert task.score(ex, "abcd") == 4.0


def test_python_task_errors(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "noex.py").write_text("def f(p, c, a):\n    return 1\n")
    (tmp_path / "badret.py").write_text(
        "def examples():\n    return [{'prompt': 'a=', 'answer': 'b'}]\n"
        "def f(p, c, a):\n    return 'high'\n"
    )
    with pytest.raises(ValueError, match="cannot import module 'no_such_mod_xyz'"):
        get_task("python:no_such_mod_xyz:f")
    with pytest.raises(ValueError, match="has no function 'g'"):
        get_task("python:noex:g")
    with pytest.raises(ValueError, match=r"defines no examples\(\)"):
        get_task("python:noex:f")
    with pytest.raises(ValueError, match="expected python:MODULE:FUNCTION"):
        get_task("python:justone")
    task = get_task("python:badret:f")
    with pytest.raises(ValueError, match="not a number"):
        task.score(task.eval_examples(1)[0], "x")


def test_unknown_task_and_option_messages():
    with pytest.raises(ValueError) as err:
        get_task("revrse")
    msg = str(err.value)
    assert "'revrse'" in msg and "reverse, add, sort, mixed-scale, jsonl:PATH" in msg
    assert "\n" not in msg
    with pytest.raises(
        ValueError, match=r"unknown option\(s\) length \(allowed: min_len, max_len\)"
    ):
        get_task("reverse", length=3)
    with pytest.raises(ValueError, match="min_len <= max_len"):
        get_task("sort", min_len=5, max_len=2)
    assert get_task("reverse", min_len=2, max_len=2).max_new_tokens_hint == 4
