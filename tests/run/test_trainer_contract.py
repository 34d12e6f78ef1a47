"""Trainer contract: one suite run against both trainers, the harness PPO loop and TRL's
GRPOTrainer (``trainer: harness | trl``), each also with the vLLM engine as its sampler
(``rollout.sampler_backend: vllm``; slow: an engine starts per run).  Whatever trains a cell, the
sweep, the tracker and the report see the same thing: the shared metric keys once per step,
steps 0..N-1, reproducible for a seed, a divergence recorded with its reason, an interruption
with a partial summary, every summary key, and the same cached warm start."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.config import RunConfig, build_run_config
from harness.metrics import STEP_METRICS
from harness.metrics.stability import OBJECTIVE_KEYS
from harness.model.engine_support import engine_installed
from harness.run.scaffold import RunResult
from harness.run.tracked import tracked_run
from harness.run.trainers import train
from harness.tasks import get_task
from harness.tracking import MemoryTracker
from tests.support.tiny import TINY

TRAINERS = ["harness", "trl"]
# The same trainers sampling with the inference engine: an engine start per run, so slow.
ENGINE_TRAINERS = ["harness+vllm", "trl+vllm"]
_needs_engine = pytest.mark.skipif(
    not engine_installed(), reason="vllm not installed (python tools/install_engine.py)"
)
# Heads of 32 for the engine (its CPU attention takes no smaller head size).
TINY_ENGINE = {**TINY, "hidden_size": 64, "intermediate_size": 128}
STEPS = 3
UPDATES_PER_STEP = 2  # ppo_n_minibatches × ppo_epochs
WARM_STEPS = 30  # enough supervised steps that rewards (and so gradients) are not all 0

# Every step of either trainer logs these (docs/metrics.md, "trainer: trl", says which keys only
# the harness loop can fill); eval/* only on evaluation steps.
SHARED = {
    "objective/reward",
    "objective/reward_std",
    "objective/kl",
    "advantages/mean",
    "advantages/std",
    "advantages/abs_max",
    "policy/entropy",
    "policy/clipfrac",
    "policy/clipfrac_low",
    "policy/clipfrac_high",
    "policy/loss",
    "rollout/response_length",
    "rollout/truncated_frac",
    "rollout/zero_std_groups",
    "rollout/staleness",
    "stability/grad_norm",
    "stability/grad_norm_max",
    "stability/nonfinite_count",
    "stability/optimizer_steps",
    "stability/skipped_updates",
    "optim/lr",
    "perf/step_time",
    "perf/rollout_time",
    "perf/update_time",
    "perf/tokens_per_sec",
}
EVAL = {"eval/reward", "eval/accuracy"}


def cfg(trainer: str, **over: Any) -> RunConfig:
    """The same tiny cell for both trainers (expressible by TRL: group reward norm, no KL);
    ``NAME+vllm`` is trainer NAME with the engine as the sampler."""
    name, _, backend = trainer.partition("+")
    rollout: dict[str, Any] = {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 5}
    if backend:
        rollout["sampler_backend"] = backend
    base: dict[str, Any] = {
        "trainer": name,
        "steps": STEPS,
        "task": "reverse",
        "tiny": TINY_ENGINE if backend else TINY,
        "rollout": rollout,
        "ppo": {
            "ppo_n_minibatches": UPDATES_PER_STEP,
            "ppo_epochs": 1,
            "reward_norm": {"mean_level": "group", "std_level": "group"},
        },
        "eval": {"every": 2, "n_prompts": 4},  # evaluations after steps 1 and 2 (the last)
        "warm_start": {"steps": WARM_STEPS},
        "threads": 1,
    }
    return build_run_config(base, over)


def logged_run(c: RunConfig, results_dir: Path, **hooks: Any) -> tuple[RunResult, list]:
    seen: list[tuple[int, dict[str, float]]] = []
    res = train(
        c, on_metrics=lambda s, m: seen.append((s, dict(m))), results_dir=results_dir, **hooks
    )
    return res, seen


def comparable(res: RunResult) -> str:
    """The run's metrics without wall times, NaN-safe for ==."""
    return json.dumps({k: v for k, v in res.history.items() if not k.startswith("perf/")})


@pytest.fixture(
    params=[
        *TRAINERS,
        *(pytest.param(t, marks=[pytest.mark.slow, _needs_engine]) for t in ENGINE_TRAINERS),
    ]
)
def trainer(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One results directory for the module: the warm start is trained once, then cached."""
    return tmp_path_factory.mktemp("results")


class _Completed(dict):  # type: ignore[type-arg]
    """trainer -> its one completed run, trained the first time a case asks for it (an engine
    trainer's only when a slow case runs)."""

    def __init__(self, results: Path) -> None:
        super().__init__()
        self.results = results

    def __missing__(self, name: str) -> tuple[RunResult, list]:
        self[name] = logged_run(cfg(name), self.results)
        return self[name]


@pytest.fixture(scope="module")
def completed(results: Path) -> dict[str, tuple[RunResult, list]]:
    """One completed run per trainer, shared by the cases that only read it (and, once it
    exists, the warm start is in the cache: no case trains it again)."""
    return _Completed(results)


# -- contract ---------------------------------------------------------------------------------


def test_the_shared_metric_keys_are_logged_once_per_step(
    trainer: str, completed: dict[str, tuple[RunResult, list]]
) -> None:
    res, seen = completed[trainer]
    assert res.status == "completed" and res.reason == "" and res.steps_done == STEPS
    assert [s for s, _ in seen] == list(range(STEPS))
    for step, m in seen:
        assert set(m) <= set(STEP_METRICS), set(m) - set(STEP_METRICS)
        missing = SHARED - set(m)
        assert not missing, (step, missing)
        assert (EVAL <= set(m)) == (step in (1, 2)), (step, sorted(m))
        assert m["stability/optimizer_steps"] == UPDATES_PER_STEP
        assert m["stability/nonfinite_count"] == 0 and m["stability/skipped_updates"] == 0
        assert 0.0 <= m["objective/reward"] <= 1.0 and m["objective/reward_std"] >= 0
        assert m["objective/kl"] == 0.0 and m["rollout/staleness"] == 0.0  # no reference, fresh
        assert 0.0 <= m["policy/clipfrac"] <= 1.0 and m["policy/entropy"] > 0
        assert 1 <= m["rollout/response_length"] <= 5
        assert m["stability/grad_norm_max"] >= m["stability/grad_norm"] >= 0
        assert m["perf/step_time"] > 0 and m["perf/tokens_per_sec"] > 0
    # The result's history is what on_metrics saw, one value per step (NaN where not logged).
    for key, values in res.history.items():
        assert len(values) == STEPS, key
        for step, m in seen:
            assert values[step] == pytest.approx(m[key]) if key in m else math.isnan(values[step])


def test_a_seed_gives_identical_metrics_twice(
    trainer: str, completed: dict[str, tuple[RunResult, list]], results: Path
) -> None:
    first, _ = completed[trainer]
    again, _ = logged_run(cfg(trainer), results)
    assert comparable(again) == comparable(first)
    other, _ = logged_run(cfg(trainer, seed=1), results)
    assert other.history["policy/entropy"] != first.history["policy/entropy"]  # another run


def test_the_run_records_the_machine_its_numbers_depend_on(
    trainer: str, completed: dict[str, tuple[RunResult, list]]
) -> None:
    # The same seed reproduces on one machine; another CPU's kernels give other last bits, so
    # a run says where it ran (the report and MLflow show it).
    res, _ = completed[trainer]
    assert res.tags["machine.isa"] == torch.backends.cpu.get_cpu_capability()
    assert res.tags["machine.torch_threads"] == str(torch.get_num_threads())
    assert res.tags["machine.device"] == "cpu" and int(res.tags["machine.cores"]) >= 1
    assert res.tags["machine.cpu"]


def test_the_summary_has_every_key_and_agrees_with_the_history(
    trainer: str, completed: dict[str, tuple[RunResult, list]]
) -> None:
    res, seen = completed[trainer]
    s = res.summary
    assert set(s) == set(OBJECTIVE_KEYS)
    rewards = [m["objective/reward"] for _, m in seen]
    assert s["final/reward_auc"] == pytest.approx(sum(rewards) / STEPS)
    assert s["best/reward"] >= s["final/reward"] >= min(rewards)
    assert s["start/reward"] == pytest.approx(sum(rewards) / STEPS)  # all 3 in the start window
    assert s["final/eval_reward"] == pytest.approx(seen[-1][1]["eval/reward"])
    assert s["final/eval_accuracy"] == pytest.approx(seen[-1][1]["eval/accuracy"])
    assert 0.0 <= s["start/eval_reward"] <= 1.0 and 0.0 <= s["start/eval_accuracy"] <= 1.0
    assert s["stability/diverged"] == 0.0 and math.isnan(s["stability/diverged_step"])
    assert s["stability/nonfinite_events"] == 0.0 and s["stability/skipped_steps"] == 0.0
    assert s["stability/max_drawdown"] >= 0.0
    assert res.tags["inert_clip"] == "false" and not res.inert_clip


def test_a_divergence_is_recorded_with_its_reason(
    trainer: str, completed: Any, results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NaN weights injected after the first optimizer step of step 1 (both trainers step
    ``torch.optim.AdamW``): the run is diverged at step 1, a result with step 0's metrics, and
    its tracker run FAILED with that reason."""
    completed[trainer]  # the warm start is cached before the patch: it trains with AdamW too
    real_step = torch.optim.AdamW.step
    calls = {"n": 0}

    def step(self: torch.optim.AdamW, *args: Any, **kw: Any) -> Any:
        out = real_step(self, *args, **kw)
        calls["n"] += 1
        if calls["n"] == UPDATES_PER_STEP + 1:
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        p.fill_(math.nan)
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    tracker = MemoryTracker()
    res, rid = tracked_run(cfg(trainer), tracker, experiment="e", run_name="r", results_dir=results)
    assert calls["n"] >= UPDATES_PER_STEP + 1
    assert res.status == "diverged"
    assert res.reason == "diverged at step 1: non-finite policy parameters after the update"
    assert res.steps_done == 1 and res.tags["diverged_step"] == "1"
    assert all(len(v) == 1 for v in res.history.values())
    assert res.summary["stability/diverged"] == 1.0
    assert res.summary["stability/diverged_step"] == 1.0
    assert math.isfinite(res.summary["final/reward"])  # step 0's reward, kept
    run = tracker.runs[rid]
    assert run.status == "FAILED"
    assert run.tags["run.status"] == "diverged" and run.tags["run.reason"] == res.reason
    assert [s for s, _ in run.metrics["objective/reward"]] == [0]


def test_should_stop_interrupts_with_a_partial_summary(
    trainer: str, completed: Any, results: Path
) -> None:
    asked = {"n": 0}

    def stop() -> bool:
        asked["n"] += 1
        return asked["n"] == 3  # before steps 0 and 1: go on; before step 2: stop

    tracker = MemoryTracker()
    res, rid = tracked_run(
        cfg(trainer), tracker, experiment="e", run_name="r", should_stop=stop, results_dir=results
    )
    assert asked["n"] == 3
    assert res.status == "interrupted" and res.reason == "interrupted at step 2"
    assert res.steps_done == 2 and all(len(v) == 2 for v in res.history.values())
    rewards = res.history["objective/reward"]
    assert set(res.summary) == set(OBJECTIVE_KEYS)
    assert res.summary["final/reward_auc"] == pytest.approx(sum(rewards) / 2)
    assert res.summary["final/eval_reward"] == pytest.approx(res.history["eval/reward"][1])
    assert res.summary["stability/diverged"] == 0.0
    run = tracker.runs[rid]
    assert run.status == "KILLED" and run.tags["run.status"] == "interrupted"
    assert [s for s, _ in run.metrics["objective/reward"]] == [0, 1]


def test_the_prompts_are_the_same_for_both_trainers(
    trainer: str, completed: Any, results: Path
) -> None:
    """Step t scores the prompts the seed draws for step t, each n_samples times in a row."""

    scored: list[tuple[int, list[str]]] = []
    res, _ = logged_run(cfg(trainer), results, on_prompts=lambda s, p: scored.append((s, p)))
    assert res.status == "completed"
    rng = random.Random(0)
    task = get_task("reverse")
    expect = [[e.prompt for e in task.sample(rng, 2) for _ in range(2)] for _ in range(STEPS)]
    assert scored == list(enumerate(expect))


def test_the_warm_start_is_the_shared_cached_one(trainer: str, tmp_path: Path) -> None:
    """The trainer starts from the warm start the cache holds for this model, task and seed:
    it reuses the entry made outside it (no new one) and its start eval is those weights'."""
    from harness.model.build import load_model_and_tokenizer
    from harness.run.scaffold import evaluate, warm_start

    c = cfg(trainer)
    task = get_task(c.task)
    model, tok = load_model_and_tokenizer(c.model, seed=c.seed, device="cpu", tiny=c.tiny)
    model, key = warm_start(c, model, tok, task, results_dir=tmp_path, chat_template=None)
    entries = sorted(p.name for p in (tmp_path / "warmstart").iterdir())
    assert len(entries) >= 1 and key
    expect = evaluate(model, tok, task, task.eval_examples(4), max_new_tokens=5, device="cpu")

    res, _ = logged_run(c, tmp_path)
    assert res.status == "completed", res.reason
    assert res.tags["warm_start.cache_key"] == key
    assert sorted(p.name for p in (tmp_path / "warmstart").iterdir()) == entries
    assert res.summary["start/eval_reward"] == pytest.approx(expect["eval/reward"])
    assert res.summary["start/eval_accuracy"] == pytest.approx(expect["eval/accuracy"])
