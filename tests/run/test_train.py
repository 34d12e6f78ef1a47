"""The training loop end to end on a tiny model: determinism, the inert-clip guard, divergence,
metrics reaching the tracker, every task and option combination running."""

import json
import math
import warnings

import pytest
import torch

from harness.config import build_run_config
from harness.config.schema import clip_is_inert
from harness.metrics import ASYNC_METRICS, OBJECTIVE_METRICS, OPTION_METRICS, STEP_METRICS
from harness.run.loop import run
from harness.run.tracked import tracked_run
from harness.tracking import MemoryTracker
from tests.support.tiny import TINY, tiny_reverse


def cfg(**over):
    base = tiny_reverse(3, ppo={"ppo_n_minibatches": 2}, eval={"every": 2, "n_prompts": 4})
    flat = {k: v for k, v in over.items()}
    return build_run_config(base, flat)


def test_same_config_and_seed_give_identical_histories(tmp_path):
    c = cfg(
        **{
            "rollout.staleness": 1,
            "ppo.use_decoupled_loss": True,
            "ppo.behave_imp_weight_mode": "token_mask",
        }
    )
    a = run(c, results_dir=tmp_path)
    b = run(c, results_dir=tmp_path)
    keys = [k for k in a.history if not k.startswith("perf/")]
    assert keys and a.steps_done == 3
    for k in keys:
        assert json.dumps(a.history[k]) == json.dumps(b.history[k]), k
    other = run(cfg(seed=1), results_dir=tmp_path)
    assert (
        other.history["policy/entropy"] != a.history["policy/entropy"]
    )  # another seed, another run


def test_inert_clip_is_detected_warned_and_tagged(tmp_path):
    inert = cfg(**{"ppo.ppo_n_minibatches": 1, "ppo.ppo_epochs": 1})
    assert clip_is_inert(inert)
    with pytest.warns(UserWarning, match="clipping is inert"):
        res = run(inert, results_dir=tmp_path)
    assert res.inert_clip and res.tags["inert_clip"] == "true"
    assert all(v == 0.0 for v in res.history["policy/clipfrac"])
    assert max(abs(v - 1.0) for v in res.history["policy/ratio_max"]) < 1e-4
    # decoupled with one minibatch is inert even with stale data; 2 minibatches is not
    assert clip_is_inert(
        cfg(**{"ppo.ppo_n_minibatches": 1, "rollout.staleness": 2, "ppo.use_decoupled_loss": True})
    )
    assert not clip_is_inert(cfg(**{"ppo.ppo_n_minibatches": 1, "rollout.staleness": 2}))
    assert not clip_is_inert(cfg())


def test_absurd_learning_rate_diverges_with_reason_and_keeps_metrics(tmp_path):
    res = run(cfg(steps=40, **{"optim.lr": 1e20, "optim.grad_clip": None}), results_dir=tmp_path)
    assert res.status == "diverged"
    assert res.reason.startswith(f"diverged at step {res.steps_done}: ")
    assert 0 < res.steps_done < 40
    assert len(res.history["objective/reward"]) == res.steps_done
    assert res.summary["stability/diverged"] == 1.0


def test_every_step_metric_reaches_the_tracker(tmp_path):
    c = cfg(
        **{
            "critic.enabled": True,
            "ppo.kl_ctl": 0.05,
            "ppo.entropy_coef": 0.01,  # the untrained model earns no reward; this moves it anyway
            "rollout.staleness": 1,
            "ppo.use_decoupled_loss": True,
            "ppo.behave_imp_weight_mode": "token_truncate",
            "ppo.behave_imp_weight_cap": 2.0,
            "eval.every": 1,
            "eval.samples": 2,  # the sampled eval metrics (pass@k, mean@n) too
        }
    )
    tracker = MemoryTracker()
    res, rid = tracked_run(c, tracker, experiment="t", run_name="r", results_dir=tmp_path)
    run_ = tracker.runs[rid]
    assert run_.status == "FINISHED"
    logged = set(run_.metrics)
    # those: test_objectives_train.py, test_stability_options.py
    missing = set(STEP_METRICS) - logged - OBJECTIVE_METRICS - OPTION_METRICS - ASYNC_METRICS
    assert not missing, missing
    assert run_.params["ppo.kl_ctl"] == "0.05" and "config.yaml" in run_.artifacts
    assert math.isfinite(tracker.get_metric_history(rid, "final/reward")[-1][1])
    assert any(v != 0 for _, v in tracker.get_metric_history(rid, "objective/kl"))


@pytest.mark.parametrize("task", ["reverse", "add", "sort", "mixed-scale"])
def test_each_builtin_task_trains(task, tmp_path):
    res = run(cfg(task=task, steps=2), results_dir=tmp_path)
    assert res.status == "completed" and res.steps_done == 2


def test_jsonl_and_python_tasks_train(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text(
        "\n".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(20))
    )
    assert run(cfg(task=f"jsonl:{data}", steps=2), results_dir=tmp_path).status == "completed"
    mod = tmp_path / "myreward.py"
    mod.write_text(
        "def score(prompt, completion, answer):\n    return float(completion.strip() == answer)\n"
        "def examples():\n    return [{'prompt': f'{i}*2=', 'answer': str(2 * i)} for i in range(20)]\n"
    )
    assert run(cfg(task=f"python:{mod}:score", steps=2), results_dir=tmp_path).status == "completed"


def test_local_hf_model_directory(tmp_path):
    from harness.model.build import TinyModelConfig, build_model, build_tokenizer

    tok = build_tokenizer()
    model = build_model(tok, TinyModelConfig(**TINY), seed=3)
    path = tmp_path / "mymodel"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    res = run(cfg(model=str(path), steps=2), results_dir=tmp_path)
    assert res.status == "completed"


def test_warm_start_is_cached_and_reused(tmp_path):
    c = cfg(steps=1, **{"warm_start.steps": 5, "warm_start.batch_size": 4})
    a = run(c, results_dir=tmp_path)
    files = sorted(p.name for p in (tmp_path / "warmstart").glob("*.safetensors"))
    b = run(c, results_dir=tmp_path)
    assert (
        len(files) == 1
        and sorted(p.name for p in (tmp_path / "warmstart").glob("*.safetensors")) == files
    )
    assert a.history["objective/reward"] == b.history["objective/reward"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_run_with_bf16(tmp_path):
    res = run(cfg(device="cuda", bf16=True, steps=2), results_dir=tmp_path)
    assert res.status == "completed"


@pytest.mark.slow
def test_reward_rises_on_reverse_with_the_default_config(tmp_path):
    """The default run config: mean reward over the last 20 steps beats the first 20."""
    from harness.config import load_run_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run(load_run_config("experiments/run-default.yaml"), results_dir=tmp_path)
    r = res.history["objective/reward"]
    first, last = sum(r[:20]) / 20, sum(r[-20:]) / 20
    assert last > first + 0.03, (first, last)


def test_start_eval_is_the_policy_before_any_update(tmp_path):
    """start/eval_reward is the warm-started policy's greedy eval before step 0: with lr 0 the
    policy never moves, so the last eval equals it; final/eval_reward is the last logged eval."""
    still = run(cfg(steps=2, **{"optim.lr": 1e-12, "warm_start.steps": 5}), results_dir=tmp_path)
    s = still.summary
    assert 0.0 <= s["start/eval_reward"] <= 1.0 and 0.0 <= s["start/eval_accuracy"] <= 1.0
    assert s["final/eval_reward"] == still.history["eval/reward"][-1]
    assert s["final/eval_reward"] == pytest.approx(s["start/eval_reward"], abs=1e-12)
    moved = run(cfg(steps=2, **{"optim.lr": 0.5, "warm_start.steps": 5}), results_dir=tmp_path)
    assert moved.summary["start/eval_reward"] == s["start/eval_reward"]  # same warm start
    evals = [v for v in moved.history["eval/reward"] if math.isfinite(v)]
    assert moved.summary["final/eval_reward"] == evals[-1]


def test_rollout_staleness_is_the_lag_each_step_sampled_at(tmp_path):
    """With staleness 2 the rollouts sample at lags 0, 1, 2, 2: step 0 has only the start
    weights (logging the lag the *next* step would use said 1 there)."""
    res = run(cfg(steps=4, **{"rollout.staleness": 2}), results_dir=tmp_path)
    assert res.status == "completed", res.reason
    assert res.history["rollout/staleness"] == [0.0, 1.0, 2.0, 2.0]
    fresh = run(cfg(steps=2), results_dir=tmp_path)
    assert fresh.history["rollout/staleness"] == [0.0, 0.0]
