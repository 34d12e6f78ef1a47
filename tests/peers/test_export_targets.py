"""`harness export` output a user can paste: the TRL snippet builds the real GRPOConfig (and
peft LoraConfig) on this CPU machine, verl/AReaL keys exist in those frameworks' own configs,
nothing (LoRA, precision, checkpointing, betas, group size) is dropped silently, hostile file
names / labels / module names cannot inject code, and `--best` exports a search's best point."""

from __future__ import annotations

import ast
import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.config import build_run_config
from harness.config.experiment import load_experiment
from harness.peers.export import comment, export_areal, export_trl, export_verl
from tests.support.experiments import search_file, smoke_base

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "experiments" / "smoke.yaml"
LORA = {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]}

# Every key the verl export may write, as it appears in verl's own config files:
# volcengine/verl verl/trainer/config/_generated_ppo_trainer.yaml (the flattened ppo_trainer.yaml)
# and verl/trainer/config/optim/fsdp.yaml (`betas` of the actor's FSDP optimizer).
VERL_KEYS = {
    "algorithm.adv_estimator",
    "algorithm.norm_adv_by_std_in_grpo",
    "algorithm.gamma",
    "algorithm.lam",
    "algorithm.use_kl_in_reward",
    "algorithm.kl_penalty",
    "algorithm.kl_ctrl.type",
    "algorithm.kl_ctrl.kl_coef",
    "actor_rollout_ref.actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high",
    "actor_rollout_ref.actor.clip_ratio_c",
    "actor_rollout_ref.actor.policy_loss.loss_mode",
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio",
    "actor_rollout_ref.actor.policy_loss.clip_cov_lb",
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub",
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio",
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef",
    "actor_rollout_ref.actor.loss_agg_mode",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_epochs",
    "actor_rollout_ref.actor.entropy_coeff",
    "actor_rollout_ref.actor.grad_clip",
    "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.actor.optim.weight_decay",
    "actor_rollout_ref.actor.optim.lr_warmup_steps",
    "actor_rollout_ref.actor.optim.warmup_style",
    "actor_rollout_ref.actor.optim.min_lr_ratio",
    "actor_rollout_ref.actor.optim.num_cycles",
    "actor_rollout_ref.actor.optim.betas",
    "actor_rollout_ref.model.enable_gradient_checkpointing",
    "actor_rollout_ref.model.lora_rank",
    "actor_rollout_ref.model.lora_alpha",
    "actor_rollout_ref.model.target_modules",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.temperature",
    "actor_rollout_ref.rollout.top_p",
    "actor_rollout_ref.rollout.dtype",
    "data.train_batch_size",
    "data.max_response_length",
    "critic.optim.lr",
    "critic.cliprange_value",
}
# verl/workers/config/optimizer.py, FSDPOptimizerConfig.__post_init__:
# assert self.warmup_style in ["constant", "cosine"]
VERL_WARMUP_STYLES = {"constant", "cosine"}

# AReaL's keys, from inclusionAI/AReaL areal/api/cli_args.py: PPOActorConfig and its base
# TrainEngineConfig (actor.*), OptimizerConfig (actor.optimizer.*), NormConfig (*_norm.*),
# GenerationHyperparameters (gconfig.*), InferenceEngineConfig (rollout.*), DatasetConfig
# (train_dataset.*).  (Behaviour-weight keys are not listed: the configs below do not set them.)
AREAL_KEYS = {
    "actor": {
        "group_size",
        "eps_clip",
        "eps_clip_higher",
        "c_clip",
        "use_decoupled_loss",
        "recompute_logprob",
        "prox_logp_method",
        "importance_sampling_level",
        "ppo_n_minibatches",
        "adv_norm",
        "reward_norm",
        "kl_ctl",
        "kl_estimator",
        "discount",
        "gae_lambda",
        "reward_scaling",
        "reward_bias",
        "reward_clip",
        "temperature",
        "dtype",
        "gradient_checkpointing",
        "optimizer",
        "use_lora",
        "lora_rank",
        "lora_alpha",
        "target_modules",
    },
    "optimizer": {
        "lr",
        "weight_decay",
        "beta1",
        "beta2",
        "gradient_clipping",
        "lr_scheduler_type",
        "warmup_steps_proportion",
    },
    "norm": {"mean_level", "mean_leave1out", "std_level", "std_unbiased", "eps", "group_size"},
    "gconfig": {"n_samples", "max_new_tokens", "temperature", "top_p"},
    "rollout": {"max_head_offpolicyness"},
    "train_dataset": {"batch_size"},
}
AREAL_SCHEDULERS = {"linear", "cosine", "constant"}  # OptimizerConfig.lr_scheduler_type choices


def run_snippet(text: str) -> dict:
    """Execute an exported TRL snippet (it imports TRL/peft itself); its namespace."""
    namespace: dict = {}
    exec(compile(text, "export", "exec"), namespace)  # noqa: S102 — the code under test
    return namespace


def verl_overrides(text: str) -> dict[str, str]:
    """What a shell hands verl: the words of the output (comments dropped), as key -> value."""
    out = {}
    for word in shlex.split(text, comments=True):
        key, sep, value = word.partition("=")
        assert sep and key not in out, word
        out[key] = value
    return out


def export(args: list[str]) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, ["export", *args])
    return r.exit_code, r.stdout, r.stderr or ""


# ---------------------------------------------------------------------------------------------
# TRL


def test_trl_cpu_bf16_cell_builds_its_grpo_config_on_this_machine():
    """bf16 on a CPU cell: HF refuses bf16=True without use_cpu=True on a machine with no GPU."""
    import torch

    if torch.cuda.is_available():  # pragma: no cover - the check is about CPU-only machines
        pytest.skip("needs a machine without CUDA")
    cfg = build_run_config({}, {"bf16": True, "device": "cpu"})
    text = export_trl(cfg)
    args = run_snippet(text)["args"]
    assert args.bf16 is True and args.use_cpu is True
    gpu = export_trl(build_run_config({}, {"bf16": True, "device": "cuda"}))
    assert "use_cpu=False" in gpu  # a GPU cell trains on its accelerator


def test_trl_exports_lora_and_checkpointing_as_real_objects():
    cfg = build_run_config(
        {},
        {
            "model_options.lora": LORA,
            "model_options.gradient_checkpointing": True,
            "ppo.reward_norm": {"mean_level": "group", "std_level": "group"},
            "ppo.adv_norm": None,
        },
    )
    ns = run_snippet(export_trl(cfg))
    lora, args = ns["peft_config"], ns["args"]
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (4, 8, pytest.approx(0.1))
    assert set(lora.target_modules) == {"q_proj", "v_proj"} and lora.bias == "none"
    assert args.gradient_checkpointing is True
    all_linear = build_run_config({}, {"model_options.lora": {"target_modules": ["all-linear"]}})
    assert run_snippet(export_trl(all_linear))["peft_config"].target_modules == "all-linear"


# ---------------------------------------------------------------------------------------------
# verl


def test_verl_keys_exist_in_verl_and_nothing_is_dropped():
    cfg = build_run_config(
        {},
        {
            "model_options.lora": LORA,
            "model_options.gradient_checkpointing": True,
            "bf16": True,
            "optim.beta1": 0.8,
            "optim.beta2": 0.95,
            "optim.schedule": "cosine",
            "ppo.reward_norm": {"mean_level": "group", "std_level": "group"},
        },
    )
    text = export_verl(cfg)
    kv = verl_overrides(text)
    assert set(kv) <= VERL_KEYS, set(kv) - VERL_KEYS
    assert kv["actor_rollout_ref.model.lora_rank"] == "4"
    assert kv["actor_rollout_ref.model.lora_alpha"] == "8"
    assert kv["actor_rollout_ref.model.target_modules"] == "[q_proj,v_proj]"
    assert kv["actor_rollout_ref.model.enable_gradient_checkpointing"] == "True"
    assert kv["actor_rollout_ref.actor.optim.betas"] == "[0.8,0.95]"
    assert kv["actor_rollout_ref.rollout.dtype"] == "bfloat16"
    assert kv["actor_rollout_ref.actor.optim.warmup_style"] == "cosine"
    comments = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert any(ln.startswith("# model_options.lora.dropout=0.1") for ln in comments)
    assert any(ln.startswith("# model_options.dtype=bfloat16") for ln in comments)
    # verl's default is checkpointing on: the harness's off is written, not left to verl
    off = verl_overrides(export_verl(build_run_config({}, {})))
    assert off["actor_rollout_ref.model.enable_gradient_checkpointing"] == "False"


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_verl_warmup_style_is_one_verl_accepts(schedule):
    text = export_verl(build_run_config({}, {"optim.schedule": schedule, "optim.warmup_steps": 3}))
    kv = verl_overrides(text)
    style = kv.get("actor_rollout_ref.actor.optim.warmup_style")
    if schedule == "linear":
        assert style is None and "# optim.schedule=linear: verl's FSDP optimizer" in text
    else:
        assert style == schedule and style in VERL_WARMUP_STYLES
    assert kv["actor_rollout_ref.actor.optim.lr_warmup_steps"] == "3"


# ---------------------------------------------------------------------------------------------
# AReaL


def test_areal_group_size_is_the_cells_and_keys_exist_in_areal():
    cfg = build_run_config(
        {},
        {
            "rollout.n_samples": 6,
            "ppo.reward_norm": {"mean_level": "group", "std_level": "group"},
            "ppo.adv_norm": {"mean_level": "batch", "std_level": "batch"},
            "model_options.lora": LORA,
            "model_options.gradient_checkpointing": True,
        },
    )
    text = export_areal(cfg)
    doc = yaml.safe_load(text)
    a = doc["actor"]
    assert a["reward_norm"]["mean_level"] == "group" and a["reward_norm"]["group_size"] == 6
    assert a["adv_norm"]["group_size"] == 6 and a["group_size"] == 6
    assert doc["gconfig"]["n_samples"] == 6
    assert (a["use_lora"], a["lora_rank"], a["lora_alpha"]) == (True, 4, 8)
    assert a["target_modules"] == ["q_proj", "v_proj"]
    assert a["gradient_checkpointing"] is True and a["dtype"] == "float32"
    assert a["optimizer"]["warmup_steps_proportion"] == 0.0  # AReaL's default is 0.001
    assert "# model_options.lora.dropout=0.1: AReaL's LoRA has no dropout" in text
    assert set(a) <= AREAL_KEYS["actor"], set(a) - AREAL_KEYS["actor"]
    assert set(a["optimizer"]) <= AREAL_KEYS["optimizer"]
    assert a["optimizer"]["lr_scheduler_type"] in AREAL_SCHEDULERS
    for n in ("reward_norm", "adv_norm"):
        assert set(a[n]) <= AREAL_KEYS["norm"]
    for section in ("gconfig", "rollout", "train_dataset"):
        assert set(doc[section]) <= AREAL_KEYS[section]
    bf16 = export_areal(build_run_config({}, {"bf16": True}))
    assert yaml.safe_load(bf16)["actor"]["dtype"] == "bfloat16"
    assert "# model_options.dtype=bfloat16: approximate" in bf16


# ---------------------------------------------------------------------------------------------
# Injection: hostile values reach the text only as the intended values


HOSTILE_FILES = [
    "x\nimport os\nos.system('touch PWNED')\n",
    "a'b\"c $(touch PWNED) `id` # {x: [y]} &*!|>: - ? %",
    "nel\x85ls\u2028ps\u2029cr\rend",
]


def _grid_file(path: Path, extra_base: dict | None = None, grid: dict | None = None) -> Path:
    doc = yaml.safe_load(SMOKE.read_text())
    doc["base"].update(extra_base or {})
    if grid is not None:
        doc["grid"] = grid
        doc.pop("baseline")
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("hostile", HOSTILE_FILES, ids=["newlines", "quotes-shell-yaml", "nel-ls"])
def test_hostile_file_name_stays_a_comment_in_every_target(hostile, tmp_path):
    benign = _grid_file(tmp_path / "benign.yaml")
    evil_dir = tmp_path / "evil"
    evil_dir.mkdir()
    evil = evil_dir / (hostile + ".yaml")
    evil.write_text(benign.read_text())
    for to in ("trl", "verl", "areal"):
        outs = []
        for f in (benign, evil):
            code, out, err = export([str(f), "--cell", "c_clip=3", "--to", to])
            assert code == 0, err
            outs.append(out)
        good, bad = outs
        head = bad.split("\n", 1)[0]
        assert head.startswith("# harness cell 'c_clip=3' of ") and head.endswith(f" for {to}")
        assert bad.count("\n") == good.count("\n")  # the header is still one line
        assert len(bad.splitlines()) == len(good.splitlines())  # also for \x85, \u2028, \r
        assert bad.split("\n", 1)[1] == good.split("\n", 1)[1]  # the body is untouched
        if to == "trl":
            assert ast.dump(ast.parse(bad)) == ast.dump(ast.parse(good))
            assert run_snippet(bad)["args"].delta == 3.0
        elif to == "verl":
            assert verl_overrides(bad) == verl_overrides(good)
        else:
            assert yaml.safe_load(bad) == yaml.safe_load(good)


def test_hostile_variant_names_stay_a_comment(tmp_path):
    names = ["v\nimport os\nos.system('id')", "w'\"$(id)`id`#: [a]"]
    f = _grid_file(
        tmp_path / "variants.yaml",
        grid={"variant": {n: {"ppo.eps_clip": 0.1 + 0.1 * i} for i, n in enumerate(names)}},
    )
    for cell in load_experiment(f).cells:
        for to in ("trl", "verl", "areal"):
            code, out, err = export([str(f), "--cell", cell.label, "--to", to])
            assert code == 0, err
            assert out.split("\n", 1)[0] == comment(f"harness cell {cell.label!r} of {f} for {to}")
            body = out.split("\n", 1)[1]
            eps = cell.overrides["ppo.eps_clip"]
            if to == "trl":
                ast.parse(out)
                assert run_snippet(out)["args"].epsilon == pytest.approx(eps)
            elif to == "verl":
                assert float(verl_overrides(body)["actor_rollout_ref.actor.clip_ratio_low"]) == (
                    pytest.approx(eps)
                )
            else:
                assert yaml.safe_load(out)["actor"]["eps_clip"] == pytest.approx(eps)


MODULES = ["q_proj\nimport os", "k'\"$(touch PWNED)`id`#", "{a: [b]}", "- c: &d"]


def test_hostile_module_names_are_refused_before_any_target_sees_them(tmp_path):
    """A LoRA target must name a module of the model, so no hostile name reaches exported text
    (the exporters quote values anyway; this is the first line of defence)."""
    for modules in ([m] for m in [*MODULES, "${oc.env:HOME}"]):
        f = _grid_file(
            tmp_path / "lora.yaml",
            extra_base={"model_options": {"lora": {"target_modules": modules}}},
        )
        for target in ("trl", "verl", "areal"):
            code, out, err = export([str(f), "--cell", "c_clip=3", "--to", target])
            lines = err.strip().splitlines()
            assert code == 2 and out == "" and len(lines) == 1, (modules, target, err)
            assert "model_options.lora.target_modules" in lines[0]
            assert "matches no module" in lines[0]


# ---------------------------------------------------------------------------------------------
# --best on a search study


@pytest.mark.slow
def test_best_of_a_search_is_its_best_point_with_the_seeds_spread(tmp_path):
    import optuna

    from harness.sweep.stores.storage import make_storage

    exp = search_file(tmp_path, "bestsearch", smoke_base(), n_trials=1, seeds=2)
    results = tmp_path / "results"
    r = CliRunner().invoke(app, ["search", str(exp), "--results-dir", str(results)])
    assert r.exit_code == 0, r.output
    study = optuna.load_study(study_name="bestsearch", storage=make_storage(None, results))
    top = study.best_trial
    seeds = top.user_attrs["seed_values"][0]
    assert len(seeds) == 2 and top.value == pytest.approx(sum(seeds) / 2)
    report = (results / "bestsearch" / "report.md").read_text()
    assert f"Trial {top.number}, seed by seed: `final/reward` mean" in report
    assert "95 % bootstrap CI [" in report and "over 2 seeds" in report

    code, out, err = export([str(exp), "--best", "--to", "trl", "--results-dir", str(results)])
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == comment(f"harness point 'trial {top.number}' of {exp} for trl")
    assert lines[1].startswith("# best trial by the mean of final/reward: final/reward mean ")
    assert "over 2 seeds" in lines[1] and lines[2] == "# 1 of 1 search trials finished"
    args = run_snippet(out)["args"]
    assert args.epsilon == pytest.approx(top.params["ppo.eps_clip"])
    assert args.max_steps == 2 * 2  # steps x ppo_n_minibatches x ppo_epochs of the smoke base

    # the file changed since the study ran: said on stderr and in the output
    search_file(tmp_path, "bestsearch", smoke_base(), n_trials=1, seeds=2, steps=3)
    code, out, err = export([str(exp), "--best", "--to", "verl", "--results-dir", str(results)])
    assert code == 0, err
    assert "changed since study 'bestsearch' ran" in err
    assert any("changed since study 'bestsearch' ran" in ln for ln in out.splitlines()[:4])
    assert verl_overrides(out)["actor_rollout_ref.actor.clip_ratio_low"] == repr(
        top.params["ppo.eps_clip"]
    )


# ---------------------------------------------------------------------------------------------
# Peer versions: verl 0.9.1's GSPO aggregation, AReaL main's rejection_sampling


def test_verl_export_names_its_version_and_gspo_aggregation():
    """verl 0.9.1's gspo loss follows loss_agg_mode (<= 0.9.0 forced seq-mean-token-mean):
    the export says which release it targets and writes the aggregation, the default too."""
    for agg in ("token-mean", "seq-mean-token-mean"):
        text = export_verl(
            build_run_config(
                {}, {"ppo.importance_sampling_level": "sequence", "ppo.loss_agg_mode": agg}
            )
        )
        assert (
            text.splitlines()[0]
            == "# verl 0.9.1 overrides (keys and loss semantics of that release)"
        )
        kv = verl_overrides(text)
        assert kv["actor_rollout_ref.actor.policy_loss.loss_mode"] == "gspo"
        assert kv["actor_rollout_ref.actor.loss_agg_mode"] == agg
        assert f"# loss_mode gspo: verl 0.9.1 aggregates it by loss_agg_mode={agg}" in text
        assert "verl <= 0.9.0 forces seq-mean-token-mean" in text
    plain = export_verl(build_run_config({}, {}))
    assert plain.startswith("# verl 0.9.1 overrides") and "loss_mode gspo" not in plain


def areal_main_accepts(rs: dict) -> bool:
    """AReaL main's ``RejectionSamplingConfig.__post_init__`` (inclusionAI/AReaL
    areal/api/cli_args.py), transcribed: True where it would construct, False where it raises."""
    if set(rs) - {"level", "action", "metric", "agg", "upper", "lower"}:
        return False
    upper, lower = rs.get("upper", 5.0), rs.get("lower")
    metric, action = rs.get("metric", "ratio"), rs.get("action", "mask")
    if rs.get("level", "token") not in ("token", "sequence") or action not in ("mask", "clamp"):
        return False
    if metric not in ("ratio", "kl_k1", "kl_k2", "kl_k3"):
        return False
    if rs.get("agg", "mean") not in ("sum", "mean", "max"):
        return False
    if lower is not None and lower > upper:
        return False
    if metric == "ratio" and (upper <= 1.0 or (lower is not None and lower <= 0)):
        return lower == 0.0 and action == "clamp" and upper > 1.0  # clamp's own default 0.0
    if metric in ("kl_k2", "kl_k3") and upper <= 0:
        return False
    return not (action == "clamp" and metric != "ratio")


@pytest.mark.parametrize(
    "mode,cap", [("token_mask", 2.0), ("token_truncate", 5.0), ("sequence_mask", None)]
)
def test_areal_export_writes_legacy_modes_as_areal_mains_rejection_sampling(mode, cap):
    over = {"ppo.use_decoupled_loss": True, "ppo.behave_imp_weight_mode": mode}
    if cap is not None:
        over["ppo.behave_imp_weight_cap"] = cap
    text = export_areal(build_run_config({}, over))
    actor = yaml.safe_load(text)["actor"]
    assert "behave_imp_weight_mode" not in actor and "behave_imp_weight_cap" not in actor
    rs = actor["rejection_sampling"]
    assert areal_main_accepts(rs), rs
    level, kind = mode.split("_")
    assert rs["level"] == level and rs["action"] == ("mask" if kind == "mask" else "clamp")
    assert rs["upper"] == (float("inf") if cap is None else cap)
    assert f"# ppo.behave_imp_weight_mode={mode} (cap {cap}): AReaL main removed" in text


def test_areal_export_comments_what_areal_main_refuses():
    base = {"ppo.use_decoupled_loss": True}
    kpop = {"metric": "binary_kl", "upper": 0.1}
    text = export_areal(build_run_config({}, {**base, "ppo.rejection_sampling": kpop}))
    assert "rejection_sampling" not in yaml.safe_load(text)["actor"]
    assert "# ppo.rejection_sampling.metric=binary_kl: AReaL main refuses it" in text
    assert not areal_main_accepts({"metric": "binary_kl", "upper": 0.1})
    ok = {"level": "sequence", "metric": "kl_k3", "agg": "max", "upper": 0.5}
    text = export_areal(build_run_config({}, {**base, "ppo.rejection_sampling": ok}))
    rs = yaml.safe_load(text)["actor"]["rejection_sampling"]
    assert areal_main_accepts(rs) and rs["metric"] == "kl_k3" and rs["agg"] == "max"
