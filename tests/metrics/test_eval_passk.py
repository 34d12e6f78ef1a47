"""Held-out evaluation as practitioners report it: accuracy at a reward threshold, unbiased
pass@k and mean@n over sampled completions, in the step metrics and the run summary."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from harness.cli import app
from harness.config import build_run_config
from harness.metrics.passk import mean_pass_at_k, pass_at_k
from harness.run.loop import run
from tests.support.tiny import TINY_SETS, set_flags, tiny_reverse


def test_golden_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 − C(3,2)/C(5,2)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0  # only 2 wrong samples: any 3 contain a right one
    assert mean_pass_at_k([0, 5], 5, 1) == pytest.approx(0.5)
    assert math.isnan(mean_pass_at_k([], 5, 1))


# No per-example deadline: Hypothesis's default (200 ms of wall time) fails an example the
# scheduler or a garbage collection pauses, as a loaded 2-core machine does (the other
# property tests say the same). The arithmetic itself takes microseconds.
@settings(deadline=None)
@given(n=st.integers(1, 40), data=st.data())
def test_agrees_with_the_binomial_formula(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    expected = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n, c, k", [(4, 1, 2), (6, 2, 3), (5, 4, 1), (7, 0, 2)])
def test_is_the_mean_of_any_correct_over_every_k_subset(n, c, k):
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    naive = sum(any(s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(naive)


@pytest.mark.parametrize("n, c, k", [(3, 1, 4), (3, 1, 0), (3, 4, 1)])
def test_impossible_counts_are_refused(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def _cfg(**over):
    base = tiny_reverse(2, eval={"every": 1, "n_prompts": 4, "samples": 4, "k": 2})
    return build_run_config(base, over)


def test_a_run_logs_pass_at_k_and_its_summary_keeps_the_last(tmp_path):
    res = run(_cfg(), results_dir=tmp_path)
    h = res.history
    for key in ("eval/pass_at_1", "eval/pass_at_k", "eval/mean_at_n"):
        assert len(h[key]) == 2 and all(0.0 <= v <= 1.0 for v in h[key]), (key, h[key])
    # pass@k never falls below pass@1 on the same samples.
    pairs = zip(h["eval/pass_at_k"], h["eval/pass_at_1"], strict=True)
    assert all(k >= one - 1e-12 for k, one in pairs)
    assert res.summary["final/eval_pass_at_k"] == pytest.approx(h["eval/pass_at_k"][-1])
    assert res.summary["final/eval_mean_at_n"] == pytest.approx(h["eval/mean_at_n"][-1])
    # Before training: the start pass@k and pass@1 (the report compares the final with them).
    start_k, start_1 = res.summary["start/eval_pass_at_k"], res.summary["start/eval_pass_at_1"]
    assert 0.0 <= start_1 <= start_k + 1e-12 <= 1.0 + 1e-12


def test_threshold_zero_counts_every_prompt_solved_and_no_samples_means_no_pass_at_k(tmp_path):
    res = run(_cfg(**{"eval.threshold": 0.0, "eval.samples": 0}), results_dir=tmp_path)
    assert res.history["eval/accuracy"] == [1.0, 1.0]  # every built-in reward is >= 0
    assert "eval/pass_at_k" not in res.history
    assert math.isnan(res.summary["final/eval_pass_at_k"])
    assert math.isnan(res.summary["start/eval_pass_at_k"])


def test_k_above_the_samples_is_one_line(tmp_path):
    r = CliRunner().invoke(
        app,
        ["run", "--set", "eval.samples=2", "--set", "eval.k=3", "--results-dir", str(tmp_path)],
    )
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "eval.k" in lines[0] and "eval.samples" in lines[0], r.stderr
    assert not any(tmp_path.iterdir())


def test_the_console_summary_shows_pass_at_k_only_when_sampled(tmp_path, monkeypatch):
    from harness import tracking
    from harness.tracking import MemoryTracker

    monkeypatch.setattr(tracking, "open_tracker", lambda uri, results_dir: MemoryTracker())
    base = ["run", "--results-dir", str(tmp_path), "--set", "steps=1", "--set", "threads=1"]
    base += ["--set", "eval.n_prompts=2"] + set_flags(*TINY_SETS)
    sampled = CliRunner().invoke(app, [*base, "--set", "eval.samples=2", "--set", "eval.k=2"])
    assert sampled.exit_code == 0, sampled.output
    assert "final/eval_pass_at_k" in sampled.output and "final/eval_mean_at_n" in sampled.output
    greedy = CliRunner().invoke(app, base)
    assert greedy.exit_code == 0, greedy.output
    assert "pass_at" not in greedy.output
