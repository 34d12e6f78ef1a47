"""One metric vocabulary: every metric key the code emits or looks up is defined in harness.metrics.

Two guards.  Statically, every string literal in harness/ and benchmarks/ outside harness/metrics/
that has the shape of a metric key must be a defined name, so a new name cannot be introduced
anywhere but harness/metrics/.  Dynamically, what the PPO update (under every objective, with
behaviour weighting on) and a finished run actually log is in the vocabulary, and the runtime
checks refuse an undefined name.
"""

from __future__ import annotations

import ast
import copy
import math
import re
from pathlib import Path

import pytest
import torch

from harness.config import PPOActorConfig
from harness.metrics import OBJECTIVE_METRICS, STEP_METRICS, check_names
from harness.metrics.stability import (
    OBJECTIVE_KEYS,
    RUN_KEYS,
    RUN_SUMMARY_KEYS,
    check_run_names,
    summarize_run,
)
from harness.model.build import TinyModelConfig, build_model, build_tokenizer
from harness.ppo import POLICY_LOSSES, RejectionSampling
from harness.ppo.actor import PPOActor
from harness.ppo.objectives import lookup
from harness.ppo.objectives.clip_cov import ClipCovOptions
from harness.ppo.objectives.kl_cov import KLCovOptions
from harness.run.loop import RunResult
from harness.run.tracked import finish_tracked_run
from harness.sampling.local import sample
from harness.tracking import MemoryTracker
from tests.support.batches import stale_update_batch
from tests.support.objective_stats import OWN_STATS
from tests.support.tiny import TINY

ROOT = Path(__file__).resolve().parents[2]
PREFIXES = "objective|eval|policy|advantages|critic|rollout|stability|optim|perf|final|best|start"
METRIC_SHAPE = re.compile(rf"^({PREFIXES})/[a-z0-9_]+$")
VOCABULARY = set(STEP_METRICS) | RUN_KEYS


def _metric_literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and METRIC_SHAPE.match(node.value)
    ]


def test_metric_shaped_literals_outside_metrics_are_defined_names():
    files = [
        p
        for p in [*(ROOT / "harness").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
        if "metrics" not in p.relative_to(ROOT).parts[:2]
    ]
    found = {(p, line, key) for p in files for line, key in _metric_literals(p)}
    assert len(found) > 100  # the scan sees the loop, the actor, the report, the console, ...
    unknown = sorted(
        f"{p.relative_to(ROOT)}:{line}: {key}" for p, line, key in found if key not in VOCABULARY
    )
    assert not unknown, "metric names not defined in harness/metrics/:\n" + "\n".join(unknown)


def test_the_scan_would_catch_a_new_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('metrics = {"policy/clip_fraction": 0.0, "objective/reward": 1.0}\n')
    keys = [key for _, key in _metric_literals(bad)]
    assert keys == ["policy/clip_fraction", "objective/reward"]
    assert [k for k in keys if k not in VOCABULARY] == ["policy/clip_fraction"]


def test_runtime_checks_refuse_undefined_names():
    check_names({"policy/clipfrac": 0.1, "objective/reward": 1.0})
    with pytest.raises(KeyError, match="policy/clip_fraction"):
        check_names({"policy/clip_fraction": 0.1})
    check_run_names({"final/reward": 1.0, "final/steps_done": 3.0, "start/eval_reward": 0.0})
    with pytest.raises(KeyError, match="final/rewards"):
        check_run_names({"final/rewards": 1.0})


@pytest.fixture(scope="module")
def setup():
    tok = build_tokenizer()
    model = build_model(tok, TinyModelConfig(**TINY), seed=0)
    gen = torch.Generator().manual_seed(0)
    prompts = ["123>", "4567>", "89>", "2468>"]
    rb = sample(model, tok, prompts, n_samples=2, max_new_tokens=5, generator=gen)
    return model, stale_update_batch(rb)


# Options that make the covariance objectives select tokens in a batch this small.
EXTRA = {
    "clip_cov": dict(clip_cov=ClipCovOptions(ratio=0.2, cov_lb=-100.0, cov_ub=100.0)),
    "kl_cov": dict(kl_cov=KLCovOptions(ratio=0.2)),
}
OWN_KEYS = OWN_STATS


@pytest.mark.parametrize("objective", POLICY_LOSSES)
def test_ppo_update_logs_only_vocabulary_keys(setup, objective):
    model, batch = setup
    m = copy.deepcopy(model)
    # token-mean where the objective allows it, else its first aggregation (LUSPO has one)
    aggs = lookup(objective).aggregations
    cfg = PPOActorConfig(
        policy_loss=objective,
        use_decoupled_loss=True,
        rejection_sampling=RejectionSampling(upper=5.0),
        ppo_n_minibatches=2,
        loss_agg_mode="token-mean" if "token-mean" in aggs else aggs[0],
        **EXTRA.get(objective, {}),
    )
    stats = PPOActor(cfg, m, torch.optim.SGD(m.parameters(), lr=1e-3)).ppo_update(dict(batch))
    assert set(stats) <= set(STEP_METRICS), sorted(set(stats) - set(STEP_METRICS))
    # An objective not listed here is held to its own declaration (its stats in the registry).
    declared = {k for k in lookup(objective).stats if k in OBJECTIVE_METRICS}
    assert declared == OWN_KEYS.get(objective, declared)
    expected = {"policy/clipfrac", "policy/behave_ess", "stability/grad_norm"} | declared
    assert expected <= set(stats), sorted(expected - set(stats))
    assert stats["stability/optimizer_steps"] == 2
    assert all(math.isfinite(stats[k]) for k in expected), {k: stats[k] for k in expected}


def test_a_finished_run_logs_only_run_keys():
    history = {"objective/reward": [0.1 * i for i in range(12)], "policy/approx_kl": [0.01] * 12}
    summary = summarize_run(history)
    assert tuple(summary) == RUN_SUMMARY_KEYS
    summary.update({"start/reward": 0.45, "final/eval_reward": 0.5})
    assert set(summary) <= set(OBJECTIVE_KEYS)
    tracker = MemoryTracker()
    rid = tracker.start_run(experiment="vocabulary", run_name="r")
    result = RunResult(
        status="completed",
        reason="",
        steps_done=12,
        history=history,
        summary=summary,
        wall_time=2.5,
        inert_clip=False,
    )
    finish_tracked_run(tracker, rid, result)
    logged = set(tracker.runs[rid].metrics)
    assert {"final/reward", "final/steps_done", "final/wall_time"} <= logged <= RUN_KEYS
    assert tracker.runs[rid].metrics["final/steps_done"] == [(0, 12.0)]

    bad = dict(summary, **{"final/rewards": 1.0})
    rid2 = tracker.start_run(experiment="vocabulary", run_name="bad")
    with pytest.raises(KeyError, match="final/rewards"):
        finish_tracked_run(tracker, rid2, RunResult(**{**result.__dict__, "summary": bad}))
    assert not tracker.runs[rid2].metrics  # refused before anything was logged


# ---------------------------------------------------------------- the semantics doc's names
SEMANTICS = ROOT / "docs" / "ppo-semantics.md"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_cited_section_and_quirk_of_the_semantics_doc_exists():
    headings = [
        line.lstrip("#").strip()
        for line in SEMANTICS.read_text().splitlines()
        if line.startswith("#")
    ]
    slugs = {_slug(h) for h in headings}
    quirks = {h.split(":")[0] for h in headings if re.match(r"Q\d+: ", h)}
    assert {"Q1", "Q4", "Q6", "Q8"} <= quirks
    sources = [*(ROOT / "harness").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    sources += [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    cited, anchors, numbers = set(), set(), set()
    for path in sources:
        # Join wrapped comment/docstring lines so that a heading split over two lines reads whole.
        text = re.sub(r"\s*\n\s*(#(?!#)\s*)?", " ", path.read_text())
        cited |= set(re.findall(r'ppo-semantics\.md(?:``)?,? "([^"]+)"', text))
        anchors |= set(re.findall(r"ppo-semantics\.md#([\w-]+)", text))
        if path != SEMANTICS:
            numbers |= set(re.findall(r"\bQ\d+\b", text))
    assert len(cited) >= 10 and anchors
    assert not {c for c in cited if c not in headings}, "cited headings that do not exist"
    assert not {a for a in anchors if a not in slugs}, "links to anchors that do not exist"
    assert numbers and not numbers - quirks, f"quirks without a heading: {numbers - quirks}"
