"""``rg:NAME`` reasoning-gym tasks: deterministic pools, disjoint held-out prompts, the
generators' own verifiers on extracted answers, the format reward's weighted sum, one-line errors
and a run through the CLI. Nothing is downloaded."""

import random
import sys

import pytest

from harness.cli import app
from harness.tasks import get_task, score_parts
from harness.tasks.answers import AnswerSpec, compose, extract_answer, format_score
from tests.support.cli import invoke_run

pytest.importorskip("reasoning_gym")


def tagged(text: str) -> str:
    return f"<answer>{text}</answer>"


def test_pools_are_deterministic_for_a_seed_and_differ_across_seeds():
    opts = {"size": 40, "eval_size": 6}
    a = get_task("rg:basic_arithmetic", **opts)
    b = get_task("rg:basic_arithmetic", **opts)
    assert a.eval_examples(6) == b.eval_examples(6) and len(a.eval_examples(6)) == 6
    assert a.eval_examples(3) == a.eval_examples(6)[:3]  # a prefix, the same on every call
    draws_a = a.sample(random.Random(3), 12)
    assert draws_a == b.sample(random.Random(3), 12)
    assert draws_a != a.sample(random.Random(4), 12)  # the run seed changes the draw order
    other = get_task("rg:basic_arithmetic", seed=1, **opts)
    assert {e.prompt for e in other.eval_examples(6)} != {e.prompt for e in a.eval_examples(6)}
    assert a.fingerprint == b.fingerprint != other.fingerprint
    ex = a.eval_examples(1)[0]
    assert ex.prompt.endswith("Give your final answer inside <answer></answer> tags.")
    assert a.demonstration(ex) == tagged(ex.answer)


def test_held_out_and_training_pools_never_share_a_prompt():
    # One-digit sums: a small space, so the held-out items' questions recur inside the
    # training index range; the draw must still never produce one of them.
    t = get_task(
        "rg:basic_arithmetic",
        size=300,
        eval_size=50,
        min_terms=2,
        max_terms=2,
        min_digits=1,
        max_digits=1,
        operators=["+"],
        allow_parentheses=False,
        allow_negation=False,
    )
    held = {e.prompt for e in t.eval_examples(100)}
    assert 20 < len(held) <= 50
    in_range = {t._example(i).prompt for i in range(300)}  # the raw training index range
    assert in_range & held, "the space is small enough that questions recur"
    drawn = {e.prompt for e in t.sample(random.Random(0), 1500)}
    assert len(drawn) > 40 and not drawn & held


@pytest.mark.parametrize(
    "name,wrong",
    [
        ("countdown", "1+1"),
        ("knights_knaves", "nobody is a knight"),
        ("basic_arithmetic", "123456789"),
        ("gsm_symbolic", "987654"),
        ("chain_sum", "123456789"),
    ],
)
def test_generators_score_known_right_and_wrong_answers(name, wrong):
    t = get_task(f"rg:{name}", size=10, eval_size=3)
    for ex in t.eval_examples(3):
        assert t.score(ex, tagged(ex.answer)) == 1.0
        assert t.score(ex, f"thinking...\n{tagged('x')} no, {tagged(ex.answer)}\n") == 1.0
        assert t.score(ex, tagged(wrong)) < 0.2
        assert t.score(ex, ex.answer) == 0.0  # no tag: no answer extracted
    last = get_task(f"rg:{name}", size=10, eval_size=3, answer_format="last_line")
    ex = last.eval_examples(1)[0]
    assert ex.prompt.endswith("Give your final answer on the last line.")
    assert last.score(ex, f"let me see\n{ex.answer}\n") == 1.0
    assert last.score(ex, f"{ex.answer}\n{wrong}") < 0.2


def test_knights_and_knaves_verifier_rejects_the_swapped_assignment():
    t = get_task("rg:knights_knaves", size=10, eval_size=4)
    for ex in t.eval_examples(4):
        terms = t._entry(ex)["metadata"]["knight_knave_terms"]  # hero/villain, ...
        good, bad = str(terms["a_knight"]), str(terms["a_knave"])
        swapped = ex.answer.replace(good, "@").replace(bad, good).replace("@", bad)
        assert swapped != ex.answer
        assert t.score(ex, tagged(ex.answer)) == 1.0 and t.score(ex, tagged(swapped)) == 0.0


def test_scoring_survives_the_item_cache_starting_over():
    from harness.tasks import Example

    t = get_task("rg:countdown", size=8, eval_size=2)
    ex = t.sample(random.Random(0), 1)[0]
    t._items.clear()  # as when the cache bound is reached between drawing and scoring
    assert t.score(ex, tagged(ex.answer)) == 1.0
    assert t._entry(ex)["metadata"]["target"]  # the verifier sees the item's metadata
    foreign = Example(prompt=ex.prompt, answer=ex.answer)  # no source: answer only
    assert t._entry(foreign)["metadata"] == {}


def test_extraction_and_format_score():
    assert extract_answer("a <answer> 1 </answer> b <answer>2</answer>", "tag") == "2"
    assert extract_answer("no tag here", "tag") is None
    assert extract_answer("x\n 42 \n\n", "last_line") == "42"
    assert extract_answer("  \n", "last_line") is None
    assert extract_answer("  7 ", "raw") == "7"
    assert format_score("<answer>3</answer>", "tag", think=False) == 1.0
    assert format_score("<answer></answer>", "tag", think=False) == 0.0  # nothing inside
    assert format_score("<think>hmm</think> <answer>3</answer>", "tag", think=True) == 1.0
    assert format_score("<answer>3</answer><think>hmm</think>", "tag", think=True) == 0.5
    assert format_score("3", "tag", think=True) == 0.0
    assert format_score("<think>a</think>\n3", "last_line", think=True) == 1.0
    assert compose(1.0, 0.5, 0.2) == pytest.approx((0.1, 0.8))


def test_format_reward_composes_by_the_stated_weighted_sum():
    w = 0.25
    t = get_task("rg:chain_sum", size=10, eval_size=2, format_weight=w, think=True)
    ex = t.eval_examples(1)[0]
    assert "Think inside <think></think> tags first" in ex.prompt
    cases = {
        f"<think>add</think>{tagged(ex.answer)}": (w * 1.0, (1 - w) * 1.0),
        tagged(ex.answer): (w * 0.5, (1 - w) * 1.0),  # right answer, no think block
        f"<think>add</think>{tagged('123456789')}": (w * 1.0, 0.0),
        "just text": (0.0, 0.0),
    }
    for completion, (fmt, correct) in cases.items():
        got = t.score_parts(ex, completion)
        assert got == pytest.approx((fmt, correct)), completion
        assert t.score(ex, completion) == pytest.approx(fmt + correct)
        assert score_parts(t, ex, completion) == pytest.approx(got)
    assert t.demonstration(ex) == f"<think></think>{tagged(ex.answer)}"
    assert t.score(ex, t.demonstration(ex)) == pytest.approx(1.0)
    # A task without a format reward: all of it is the correct share.
    rev = get_task("reverse")
    rex = rev.eval_examples(1)[0]
    assert score_parts(rev, rex, rex.answer) == (0.0, 1.0)
    assert AnswerSpec("tag").parts("<answer>5</answer>", lambda got: float(got == "5")) == (0, 1)


# ---------------------------------------------------------------- one-line errors, exit 2


@pytest.mark.parametrize(
    "sets,expect",
    [
        (["task=rg:no_such_generator"], "unknown reasoning-gym generator 'no_such_generator'"),
        (["task=rg:countdown", "task_options.colour=red"], "unknown option(s) colour (allowed:"),
        (["task=rg:countdown", "task_options.min_numbers=four"], "task_options.min_numbers: must be an integer"),
        (["task=rg:countdown", "task_options.min_numbers=9"], "invalid options for countdown"),
        (["task=rg:countdown", "task_options.seed=-1"], "task_options.seed: must be an integer in [0,"),
        (["task=rg:countdown", "task_options.size=0"], "task_options.size: must be an integer in [1,"),
        (["task=rg:countdown", "task_options.min_value=1e400"], "task_options.min_value: must be an integer"),
        (["task=rg:countdown", "task_options.answer_format=xml"], "task_options.answer_format: must be one of"),
        (["task=rg:countdown", "task_options.format_weight=2"], "task_options.format_weight: must be a finite number in [0, 1]"),
        (["task=rg:countdown", "task_options.operators=+"], "task_options.operators: must be a list"),
    ],
)  # fmt: skip
def test_bad_rg_options_are_one_line(sets, expect, tmp_path, runner, assert_one_line_error):
    args = ["run", "--results-dir", str(tmp_path / "r")]
    for s in sets:
        args += ["--set", s]
    assert_one_line_error(runner.invoke(app, args), expect)
    assert not (tmp_path / "r").exists()


def test_empty_generator_name_is_refused():
    with pytest.raises(ValueError, match=r"expected rg:NAME"):
        get_task("rg:")


def test_missing_extra_names_it(monkeypatch, tmp_path, runner, assert_one_line_error):
    for mod in [m for m in sys.modules if m == "reasoning_gym" or m.startswith("reasoning_gym.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import now raises ImportError
    r = runner.invoke(app, ["run", "--set", "task=rg:countdown", "--results-dir", str(tmp_path)])
    assert_one_line_error(
        r, "needs the optional reasoning-gym package (pip install 'harness[tasks]')"
    )
    with pytest.raises(ValueError, match=r"harness\[tasks\]"):
        get_task("rg:countdown")


# ---------------------------------------------------------------- end to end through the CLI


def test_harness_run_trains_on_countdown_through_the_cli(tmp_path, memory_tracker, tiny_run):
    tracker = memory_tracker
    r = invoke_run(
        tmp_path / "r",
        "task=rg:countdown",
        "task_options.size=6",
        "task_options.eval_size=3",
        "task_options.format_weight=0.5",
        *tiny_run,
        "rollout.max_new_tokens=6",
    )
    assert r.exit_code == 0, r.output
    (run,) = tracker.runs.values()
    assert run.status == "FINISHED" and run.params["task"] == "rg:countdown"
    total = [v for _, v in run.metrics["objective/reward"]]
    fmt = [v for _, v in run.metrics["reward/format"]]
    correct = [v for _, v in run.metrics["reward/correct"]]
    assert len(total) == 2
    for t, f, c in zip(total, fmt, correct, strict=True):
        assert 0.0 <= f <= 0.5 and 0.0 <= c <= 0.5 and t == pytest.approx(f + c, abs=1e-6)


def test_trl_trainer_trains_on_a_reasoning_gym_task(tmp_path, memory_tracker, tiny_run):
    """``trainer: trl`` on ``rg:``: TRL's GRPOTrainer scores with the generator's own verifier."""
    tracker = memory_tracker
    r = invoke_run(
        tmp_path / "r",
        "task=rg:chain_sum",
        "task_options.size=8",
        "task_options.eval_size=2",
        "trainer=trl",
        "ppo.adv_norm=null",
        "ppo.reward_norm.mean_level=group",
        "ppo.reward_norm.std_level=group",
        *tiny_run,
        "rollout.max_new_tokens=6",
    )
    assert r.exit_code == 0, r.output
    (run,) = tracker.runs.values()
    assert run.status == "FINISHED" and run.params["trainer"] == "trl"
    rewards = [v for _, v in run.metrics["objective/reward"]]
    assert len(rewards) == 2 and all(0.0 <= v <= 1.0 for v in rewards)
