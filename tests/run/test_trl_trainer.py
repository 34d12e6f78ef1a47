"""`trainer: trl`: TRL's GRPOTrainer on the tiny model, the option mapping and its errors, metrics in
the harness vocabulary, determinism, divergence, interruption, and sweeps that resume and retry."""

import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.config import ConfigError, build_run_config
from harness.metrics import STEP_METRICS
from harness.peers.trl import TRL_MAPPING, grpo_kwargs, markdown, trl_problems
from harness.run.tracked import tracked_run
from harness.run.trainers import train
from harness.tasks import get_task
from harness.tracking import MemoryTracker
from tests.support.tiny import TINY, tiny_reverse

ROOT = Path(__file__).resolve().parents[2]
GROUP = {"mean_level": "group", "std_level": "group"}


def cfg(**over):
    ppo = {"ppo_n_minibatches": 2, "ppo_epochs": 2, "reward_norm": GROUP}
    base = tiny_reverse(3, trainer="trl", ppo=ppo, eval={"every": 2, "n_prompts": 4})
    return build_run_config(base, over)


# ---------------------------------------------------------------- mapping


def test_mapping_values_and_a_valid_grpo_config(tmp_path):
    from trl import GRPOConfig

    c = cfg(
        **{
            "ppo.eps_clip": 0.1,
            "ppo.eps_clip_higher": 0.28,
            "ppo.c_clip": 3.0,
            "ppo.ppo_epochs": 3,
            "ppo.loss_agg_mode": "seq-mean-token-mean",
            "ppo.reward_norm": {"mean_level": "group", "std_level": "batch"},
            "ppo.temperature": 0.7,
            "ppo.entropy_coef": 0.01,
            "rollout.top_p": 0.9,
            "optim.lr": 1e-4,
            "optim.grad_clip": None,
            "optim.schedule": "cosine",
            "optim.warmup_steps": 2,
            "rollout.prompts_per_step": 4,
            "rollout.n_samples": 4,
            "ppo.ppo_n_minibatches": 4,
        }
    )
    kw = grpo_kwargs(c)
    expect = {
        "epsilon": 0.1,
        "epsilon_high": 0.28,
        "delta": 3.0,
        "num_iterations": 3,
        "steps_per_generation": 4,
        "per_device_train_batch_size": 4,
        "loss_type": "grpo",
        "scale_rewards": "batch",
        "temperature": 0.7,
        "entropy_coef": 0.01,
        "top_p": 0.9,
        "top_k": 0,
        "learning_rate": 1e-4,
        "max_grad_norm": 0.0,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 2,
        "num_generations": 4,
        "max_completion_length": 5,
        "max_steps": 3 * 4 * 3,
        "beta": 0.0,
    }
    assert {k: kw[k] for k in expect} == expect
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)
    assert args.generation_batch_size == 16  # prompts_per_step × n_samples
    assert args.epsilon_high == 0.28 and args.delta == 3.0


@pytest.mark.parametrize(
    ("agg", "loss_type"),
    [
        ("token-mean", "bnpo"),
        ("seq-mean-token-mean", "grpo"),
        ("seq-mean-token-sum", "luspo"),
        ("seq-mean-token-sum-norm", "dr_grpo"),
    ],
)
def test_loss_agg_mode_maps_to_loss_type(agg, loss_type):
    assert grpo_kwargs(cfg(**{"ppo.loss_agg_mode": agg}))["loss_type"] == loss_type


@pytest.mark.parametrize(
    ("std_level", "scale"), [("group", "group"), ("batch", "batch"), (None, "none")]
)
def test_reward_norm_maps_to_scale_rewards(std_level, scale):
    c = cfg(**{"ppo.reward_norm": {"mean_level": "group", "std_level": std_level}})
    assert grpo_kwargs(c)["scale_rewards"] == scale


def test_cispo_and_sapo_map_to_their_loss_types(tmp_path):
    from trl import GRPOConfig

    c = cfg(**{"ppo.policy_loss": "cispo", "ppo.cispo.ratio_max": 4.0})
    kw = grpo_kwargs(c)
    assert kw["loss_type"] == "cispo" and kw["epsilon_high"] == 4.0
    GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)
    s = cfg(
        **{
            "ppo.policy_loss": "sapo",
            "ppo.loss_agg_mode": "seq-mean-token-mean",
            "ppo.sapo.temperature_neg": 2.0,
        }
    )
    kw = grpo_kwargs(s)
    assert kw["loss_type"] == "sapo" and kw["sapo_temperature_neg"] == 2.0
    assert kw["sapo_temperature_pos"] == 1.0
    res = train(cfg(**{"ppo.policy_loss": "cispo", "steps": 2}), results_dir=tmp_path)
    assert res.status == "completed" and res.steps_done == 2
    assert 0.0 <= res.history["policy/clipfrac_high"][0] <= 1.0


BAD = {
    "gmpo": ({"ppo.policy_loss": "gmpo"}, "ppo.policy_loss"),
    "sapo-token-mean": ({"ppo.policy_loss": "sapo"}, "ppo.loss_agg_mode"),
    "cispo-floor": (
        {"ppo.policy_loss": "cispo", "ppo.cispo.ratio_min": 0.5},
        "ppo.cispo.ratio_min",
    ),
    "critic": ({"critic.enabled": True}, "critic.enabled"),
    "staleness": ({"rollout.staleness": 2}, "rollout.staleness"),
    "decoupled": ({"ppo.use_decoupled_loss": True}, "ppo.use_decoupled_loss"),
    "is-weight": ({"ppo.correction": "token_tis"}, "ppo.correction.weight"),
    "adv_norm": ({"ppo.adv_norm": GROUP}, "ppo.adv_norm"),
    "no-reward-norm": ({"ppo.reward_norm": None}, "ppo.reward_norm"),
    "batch-mean": ({"ppo.reward_norm": {"mean_level": "batch"}}, "ppo.reward_norm"),
    "leave1out": (
        {"ppo.reward_norm": {"mean_level": "group", "mean_leave1out": True}},
        "ppo.reward_norm.mean_leave1out",
    ),
    "biased-std": (
        {"ppo.reward_norm": {"mean_level": "group", "std_unbiased": False}},
        "ppo.reward_norm.std_unbiased",
    ),
    "kl": ({"ppo.kl_ctl": 0.1}, "ppo.kl_ctl"),
    "discount": ({"ppo.discount": 0.9}, "ppo.discount"),
    "low-c-clip": ({"ppo.c_clip": 1.1}, "ppo.c_clip"),
    "one-sample": ({"rollout.n_samples": 1}, "rollout.n_samples"),
    "uneven-minibatch": ({"ppo.ppo_n_minibatches": 3}, "ppo.ppo_n_minibatches"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_inexpressible_options_are_config_errors(case):
    over, field = BAD[case]
    with pytest.raises(ConfigError) as err:
        cfg(**over)
    msg = str(err.value)
    assert msg.startswith(f"{field}: "), msg
    assert "not expressible with trainer: trl" in msg and "\n" not in msg
    # the same options are fine for the harness's own trainer
    build_run_config({"trainer": "harness", "tiny": TINY, "ppo": {"reward_norm": GROUP}}, over)


def test_every_inexpressible_option_is_named_in_one_message():
    """Three refusals at once, not one per attempt: the first field leads the line."""
    with pytest.raises(ConfigError) as err:
        cfg(**{"ppo.kl_ctl": 0.1, "ppo.discount": 0.9, "rollout.n_samples": 1})
    msg = str(err.value)
    assert "\n" not in msg and msg.count("not expressible with trainer: trl") == 1
    fields = re.findall(r"(?:^|; also )([\w.]+): ", msg)
    assert sorted(fields) == ["ppo.discount", "ppo.kl_ctl", "rollout.n_samples"], msg


def test_harness_trainer_needs_none_of_it():
    c = build_run_config({}, {"ppo.adv_norm": GROUP, "critic.enabled": True})
    assert c.trainer == "harness" and trl_problems(c)  # listed, but only trl refuses them


@pytest.mark.parametrize("command", ["run", "ablate"])
def test_cli_refuses_with_one_line_and_exit_2(command, tmp_path):
    results = tmp_path / "results"
    if command == "run":
        args = ["run", "--set", "trainer=trl", "--set", "ppo.adv_norm.mean_level=batch"]
    else:
        doc = yaml.safe_load((ROOT / "experiments" / "smoke.yaml").read_text())
        doc["base"]["trainer"] = "trl"
        doc["base"]["ppo"]["reward_norm"] = GROUP
        doc["grid"] = {"rollout.staleness": [0, 2]}
        doc["baseline"] = {"rollout.staleness": 0}
        f = tmp_path / "exp.yaml"
        f.write_text(yaml.safe_dump(doc))
        args = ["ablate", str(f)]
    r = CliRunner().invoke(app, [*args, "--results-dir", str(results)])
    err = r.stderr if r.stderr is not None else r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and "not expressible with trainer: trl" in lines[0], lines
    assert "Traceback" not in r.output
    assert not (results / "mlflow.db").exists() and not (results / "optuna-journal.log").exists()


def test_mapping_table_is_in_the_docs():
    page = (ROOT / "docs" / "trl.md").read_text()
    assert markdown() in page, "regenerate with python -m harness.peers.trl"
    assert {m.kind for m in TRL_MAPPING} <= {"exact", "approx", "must", "none"}


# ---------------------------------------------------------------- training


@pytest.mark.parametrize("task", ["reverse", "add", "sort", "mixed-scale"])
def test_trl_trains_every_builtin_task_in_the_harness_vocabulary(task, tmp_path):
    c = cfg(task=task)
    seen: list[tuple[int, dict]] = []
    res = train(c, on_metrics=lambda s, m: seen.append((s, m)), results_dir=tmp_path)
    assert res.status == "completed" and res.steps_done == 3, res.reason
    assert [s for s, _ in seen] == [0, 1, 2]
    for _, m in seen:
        assert set(m) <= set(STEP_METRICS)
        assert m["stability/optimizer_steps"] == 4  # 2 minibatches × 2 epochs
        for k in ("policy/clipfrac", "policy/clipfrac_low", "policy/clipfrac_high"):
            assert 0.0 <= m[k] <= 1.0
        assert m["policy/clipfrac"] == pytest.approx(
            m["policy/clipfrac_low"] + m["policy/clipfrac_high"], abs=1e-6
        )
        assert 0.0 <= m["objective/reward"] <= 1.0 and m["policy/entropy"] > 0
        assert 1 <= m["rollout/response_length"] <= 5
        assert m["stability/grad_norm_max"] >= m["stability/grad_norm"] >= 0
        assert math.isfinite(m["perf/step_time"]) and m["perf/rollout_time"] > 0
        assert abs(m["advantages/mean"]) < 1e-5 or m["rollout/zero_std_groups"] < 1
    assert "eval/reward" in seen[1][1] and "eval/reward" in seen[2][1]
    assert "eval/reward" not in seen[0][1]
    assert res.summary["final/eval_accuracy"] == pytest.approx(seen[-1][1]["eval/accuracy"])
    assert res.summary["final/eval_reward"] == pytest.approx(seen[-1][1]["eval/reward"])
    assert 0.0 <= res.summary["start/eval_reward"] <= 1.0
    rewards = [m["objective/reward"] for _, m in seen]
    assert res.summary["final/reward_auc"] == pytest.approx(sum(rewards) / 3)
    assert res.tags["trainer"] == "trl"


def test_trl_sees_the_harness_prompts_in_order_and_is_deterministic(tmp_path):
    c = cfg(**{"rollout.prompts_per_step": 3, "warm_start.steps": 10})
    order: list[tuple[int, list[str]]] = []
    a = train(
        c, results_dir=tmp_path, on_prompts=lambda step, prompts: order.append((step, prompts))
    )
    rng = random.Random(c.seed)
    task = get_task("reverse")
    harness_prompts = [e.prompt for _ in range(3) for e in task.sample(rng, 3)]
    assert len(set(harness_prompts)) > 1
    # step t scores prompts 3t..3t+2, each n_samples times in a row: the harness loop's draw
    assert order == [
        (t, [harness_prompts[i] for i in range(3 * t, 3 * t + 3) for _ in range(2)])
        for t in range(3)
    ]
    b = train(c, results_dir=tmp_path)
    for k, v in a.history.items():
        if not k.startswith("perf/"):
            assert v == b.history[k] or all(math.isnan(x) for x in v + b.history[k]), k
    assert a.tags["warm_start.cache_key"] == b.tags["warm_start.cache_key"] != ""


def test_trl_divergence_is_a_result_with_its_reason(tmp_path):
    c = cfg(**{"optim.lr": 1e20, "optim.grad_clip": None, "steps": 6})
    res = train(c, results_dir=tmp_path)
    assert res.status == "diverged", (res.status, res.reason)
    assert re.match(r"diverged at step \d+: ", res.reason)
    assert len(res.history["objective/reward"]) == res.steps_done <= int(res.tags["diverged_step"])

    tracker = MemoryTracker()
    res2, rid = tracked_run(c, tracker, experiment="e", run_name="r", results_dir=tmp_path)
    run = tracker.runs[rid]
    assert run.status == "FAILED" and run.tags["run.reason"] == res2.reason
    # without gradient clipping a sane run is no divergence
    ok = train(cfg(**{"optim.grad_clip": None, "steps": 4}), results_dir=tmp_path)
    assert ok.status == "completed" and ok.steps_done == 4, ok.reason


def test_trl_honours_should_stop_and_reaches_the_tracker(tmp_path):
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 2  # begin check + 1 step end pass, then stop

    tracker = MemoryTracker()
    res, rid = tracked_run(
        cfg(steps=5), tracker, experiment="e", run_name="r", should_stop=stop, results_dir=tmp_path
    )
    assert res.status == "interrupted" and res.steps_done == 2, (res.status, res.steps_done)
    run = tracker.runs[rid]
    assert run.status == "KILLED"
    assert [s for s, _ in run.metrics["objective/reward"]] == [0, 1]
    assert run.params["trainer"] == "trl" and run.tags["trainer"] == "trl"


def test_both_trainers_share_one_warm_start(tmp_path):
    over = {"warm_start.steps": 10, "steps": 1}
    h = train(cfg(trainer="harness", **over), results_dir=tmp_path)
    t = train(cfg(**over), results_dir=tmp_path)
    assert h.tags["warm_start.cache_key"] == t.tags["warm_start.cache_key"] != ""
    entries = {f.name.split(".")[0] for f in (tmp_path / "warmstart").iterdir()}
    assert entries == {h.tags["warm_start.cache_key"]}


@pytest.mark.parametrize(
    "over",
    [
        {"model_options.dtype": "bfloat16"},
        {"model_options.gradient_checkpointing": True},
        {"model_options.lora": {"r": 4}},
    ],
    ids=["bf16", "grad-ckpt", "lora"],
)
def test_model_options_pass_through_on_cpu(over, tmp_path):
    c = cfg(**over, steps=2)
    kw = grpo_kwargs(c)
    assert kw["bf16"] == ("model_options.dtype" in over)
    assert kw["gradient_checkpointing"] == ("model_options.gradient_checkpointing" in over)
    res = train(c, results_dir=tmp_path)
    assert res.status == "completed" and res.steps_done == 2, res.reason
    assert all(math.isfinite(v) for v in res.history["policy/entropy"])


@pytest.mark.gpu
@pytest.mark.parametrize(
    "over",
    [{}, {"model_options.dtype": "bfloat16"}, {"model_options.lora": {"r": 8}}],
    ids=["fp32", "bf16", "lora"],
)
def test_trl_trains_on_cuda(over, tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    c = cfg(**over, device="cuda", steps=3, **{"warm_start.steps": 20})
    res = train(c, results_dir=tmp_path)
    assert res.status == "completed" and res.steps_done == 3, res.reason
    assert all(math.isfinite(v) for v in res.history["policy/entropy"])
    assert 0.0 <= res.summary["final/eval_accuracy"] <= 1.0
    h = train(
        cfg(**over, device="cuda", steps=1, trainer="harness", **{"warm_start.steps": 20}),
        results_dir=tmp_path,
    )
    assert h.tags["warm_start.cache_key"] == res.tags["warm_start.cache_key"]


# ---------------------------------------------------------------- sweeps


def _exp(tmp_path: Path, **over) -> Path:
    doc = yaml.safe_load((ROOT / "experiments" / "smoke.yaml").read_text())
    doc["base"]["ppo"]["reward_norm"] = GROUP
    doc.update(over)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _trials(results: Path, study: str):
    import optuna

    from harness.sweep.stores.storage import make_storage

    return optuna.load_study(study_name=study, storage=make_storage(None, results)).get_trials()


@pytest.mark.slow
def test_grid_with_trainer_on_an_axis_runs_and_resumes(tmp_path):
    exp = _exp(
        tmp_path,
        name="trainers",
        grid={"trainer": ["harness", "trl"]},
        baseline={"trainer": "harness"},
        seeds=1,
        steps=2,
    )
    results = tmp_path / "results"
    runner = CliRunner()
    r = runner.invoke(app, ["ablate", str(exp), "--results-dir", str(results)])
    assert r.exit_code == 0, r.output
    ts = _trials(results, "trainers")
    assert sorted(t.user_attrs["cell"] for t in ts) == ["trainer=harness", "trainer=trl"]
    assert all(t.state.name == "COMPLETE" for t in ts)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    for t in ts:
        run = client.get_run(t.user_attrs["run_id"])
        assert run.info.status == "FINISHED"
        assert run.data.params["trainer"] == t.user_attrs["cell"].split("=")[1]
        assert len(client.get_metric_history(run.info.run_id, "policy/clipfrac")) == 2
        assert "stability/entropy_ratio" in run.data.metrics or "final/reward" in run.data.metrics
    report = (results / "trainers" / "report.md").read_text()
    assert "trainer=trl" in report and "trainer=harness" in report
    r2 = runner.invoke(app, ["ablate", str(exp), "--results-dir", str(results), "--no-report"])
    assert r2.exit_code == 0 and "2 already done, 0 enqueued" in r2.output


@pytest.mark.slow  # two processes that import TRL, one of them killed mid-trial: ~2 min
def test_killed_trl_trial_is_retried(tmp_path):
    exp = _exp(tmp_path, name="trlkill", seeds=1, steps=40)
    doc = yaml.safe_load(exp.read_text())
    doc["base"]["trainer"] = "trl"
    exp.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    env = {**os.environ, "HARNESS_HEARTBEAT_S": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "harness", "ablate", str(exp), "--results-dir", str(results)]
    proc = subprocess.Popen(
        [*cmd, "--no-report"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if any(t.state.name == "RUNNING" for t in _trials(results, "trlkill")):
                break
        except Exception:
            pass
        time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("no trial started")
    time.sleep(3)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    r = subprocess.run(
        [*cmd, "--no-report"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    ts = _trials(results, "trlkill")
    done = sorted(t.user_attrs["cell"] for t in ts if t.state.name == "COMPLETE")
    assert done == ["c_clip=3", "c_clip=none"]
    assert any(t.state.name == "FAIL" for t in ts)  # the killed attempt
