"""`harness export` of asynchronous cells (rollout.async) and of the strict lag (rollout.staleness):
each target writes its own key for η (AReaL max_head_offpolicyness, prime-rl max_async_level,
TRL AsyncGRPOConfig.max_staleness, verl's fully-async staleness_threshold) and the settings it has
for the mode; what a target lacks is a # line naming the rollout.asynchronous field.

The keys each target may write are pinned here from the peer's own config at a commit:
AReaL inclusionAI/AReaL areal/api/cli_args.py @ 0073c330da43 (InferenceEngineConfig);
prime-rl PrimeIntellect-ai/prime-rl src/prime_rl/configs/orchestrator.py @ 0083212fadd5
(OrchestratorConfig, SamplingConfig), src/prime_rl/configs/rl.py @ 539089285f96 (the shared
max_async_level), src/prime_rl/configs/trainer.py @ 0081765e6464 (AdamWConfig, LoRAConfig,
ConstantSchedulerConfig); verl volcengine/verl
recipe/fully_async_policy/config/fully_async_ppo_trainer.yaml @ 0d1d3e185fc2 (async_training);
TRL's AsyncGRPOConfig is the installed TRL 1.16 class itself."""

from __future__ import annotations

import dataclasses
import shlex
import warnings
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.config import build_run_config
from harness.peers.export import EXPORTERS, TARGETS, export_areal, export_primerl, export_verl
from harness.peers.export.asynchrony import ASYNC_GRPO_SHARED
from harness.sweep.present.cell_export import export_cell

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

B, N = 4, 2  # prompts per step, samples per prompt
BASE = {"rollout": {"prompts_per_step": B, "n_samples": N, "max_new_tokens": 8}}

AREAL_ROLLOUT_KEYS = {"max_head_offpolicyness", "consumer_batch_size", "max_concurrent_rollouts"}
PRIMERL_TOP_KEYS = {"max_async_level", "orchestrator", "trainer"}
PRIMERL_ORCH_KEYS = {
    "batch_size",
    "rollouts_per_example",
    "strict_async_level",
    "max_off_policy_steps",
    "oversampling_factor",
    "max_concurrent",
    "sampling",
}
PRIMERL_SAMPLING_KEYS = {"temperature", "max_tokens"}
PRIMERL_OPTIM_KEYS = {"type", "lr", "weight_decay", "betas1", "betas2", "max_norm"}
VERL_ASYNC_KEYS = {
    "async_training.staleness_threshold",
    "async_training.trigger_parameter_sync_step",
    "async_training.require_batches",
    "async_training.partial_rollout",
    "async_training.use_rollout_log_probs",
}

MODES = {
    "bounded": {"max_staleness": 2},
    "in_flight_keep": {"max_staleness": 2, "weight_updates": "in_flight"},
    "in_flight_recompute": {
        "max_staleness": 2,
        "weight_updates": "in_flight",
        "in_flight_kv": "recompute",
    },
    "partial": {"max_staleness": 1, "partial": True, "over_sample": 2.0},
}


def cfg(asynchronous: dict | None = None, **rollout):
    data = {"rollout": {**BASE["rollout"], **rollout}}
    if asynchronous is not None:
        data["rollout"]["async"] = asynchronous
    return build_run_config(data)


def notes(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("#")]


def verl_overrides(text: str) -> dict[str, str]:
    out = {}
    for word in shlex.split(text, comments=True):
        key, _, value = word.partition("=")
        out[key] = value
    return out


# --- AReaL ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode,bound",
    [
        ("bounded", (2 + 1) * B),  # (η + 1)·B groups at most in flight
        ("in_flight_keep", (2 + 1) * B),
        ("partial", (1 + 1) * B + B),  # plus ⌈(over_sample − 1)·B⌉ over-sampled groups
    ],
)
def test_areal_writes_eta_its_batch_and_the_harness_in_flight_bound(mode, bound):
    doc = yaml.safe_load(export_areal(cfg(MODES[mode])))
    eta = MODES[mode]["max_staleness"]
    assert doc["rollout"] == {
        "max_head_offpolicyness": eta,
        "consumer_batch_size": B,
        "max_concurrent_rollouts": bound,
    }
    assert set(doc["rollout"]) <= AREAL_ROLLOUT_KEYS


def test_areal_max_concurrent_is_written_and_the_modes_it_lacks_are_named():
    doc = yaml.safe_load(export_areal(cfg({"max_staleness": 3, "max_concurrent": 5})))
    assert doc["rollout"]["max_concurrent_rollouts"] == 5
    keep = notes(export_areal(cfg(MODES["in_flight_keep"])))
    rec = notes(export_areal(cfg(MODES["in_flight_recompute"])))
    between = notes(export_areal(cfg(MODES["bounded"])))
    assert any(n.startswith("# rollout.asynchronous.in_flight_kv=keep: AReaL re-") for n in keep)
    assert any("interruptible generation (always on; no key)" in n for n in rec)
    assert any(
        n.startswith("# rollout.asynchronous.weight_updates=between_batches") for n in between
    )
    part = notes(export_areal(cfg(MODES["partial"])))
    assert any(n.startswith("# rollout.asynchronous.over_sample=2.0: AReaL's") for n in part)
    assert any("can exceed max_staleness" in n for n in part)


def test_areal_strict_lag_is_its_bound_and_says_so():
    text = export_areal(cfg(staleness=3))
    assert yaml.safe_load(text)["rollout"] == {"max_head_offpolicyness": 3}
    assert any(
        n.startswith("# rollout.staleness=3: AReaL's max_head_offpolicyness bounds")
        for n in notes(text)
    )
    sync = export_areal(cfg())
    assert yaml.safe_load(sync)["rollout"] == {"max_head_offpolicyness": 0}
    assert "rollout.asynchronous" not in sync and "rollout.staleness" not in sync


# --- prime-rl ------------------------------------------------------------------------------------


def primerl(c) -> dict:
    doc = tomllib.loads(export_primerl(c))
    assert set(doc) <= PRIMERL_TOP_KEYS
    assert set(doc["orchestrator"]) <= PRIMERL_ORCH_KEYS
    assert set(doc["orchestrator"]["sampling"]) <= PRIMERL_SAMPLING_KEYS
    assert set(doc["trainer"]["optim"]) <= PRIMERL_OPTIM_KEYS
    return doc


def test_primerl_synchronous_strict_and_bounded():
    sync = primerl(cfg())
    assert sync["max_async_level"] == 0 and sync["orchestrator"]["strict_async_level"] is False
    assert sync["orchestrator"]["batch_size"] == B * N  # prime-rl counts samples
    assert sync["orchestrator"]["rollouts_per_example"] == N
    assert sync["orchestrator"]["sampling"] == {"temperature": 1.0, "max_tokens": 8}
    strict = primerl(cfg(staleness=2))
    assert strict["max_async_level"] == 2 and strict["orchestrator"]["strict_async_level"] is True
    bounded = primerl(cfg(MODES["bounded"]))
    assert bounded["max_async_level"] == 2
    assert bounded["orchestrator"]["strict_async_level"] is False
    assert "max_off_policy_steps" not in bounded["orchestrator"]


def test_primerl_in_flight_partial_and_concurrency():
    keep = primerl(cfg(MODES["in_flight_keep"]))
    assert keep["orchestrator"]["max_off_policy_steps"] == 2
    part = primerl(cfg(MODES["partial"]))
    assert part["orchestrator"]["oversampling_factor"] == 2.0
    capped = primerl(cfg({"max_staleness": 1, "max_concurrent": 3}))
    assert capped["orchestrator"]["max_concurrent"] == 3 * N
    text = export_primerl(cfg(MODES["in_flight_recompute"]))
    assert any(
        n.startswith("# rollout.asynchronous.in_flight_kv=recompute: prime-rl keeps")
        for n in notes(text)
    )
    assert any(
        n.startswith("# rollout.asynchronous.weight_updates=between_batches: prime-rl")
        for n in notes(export_primerl(cfg(MODES["bounded"])))
    )


def test_primerl_optimizer_and_lora():
    c = build_run_config(
        {
            "optim": {"lr": 1e-5, "weight_decay": 0.1, "grad_clip": None},
            "model_options": {"lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj"]}},
        }
    )
    doc = primerl(c)
    assert doc["trainer"]["optim"] == {
        "type": "adamw",
        "lr": 1e-5,
        "weight_decay": 0.1,
        "betas1": 0.9,
        "betas2": 0.999,
        "max_norm": 1e9,
    }
    assert doc["trainer"]["model"]["lora"] == {
        "rank": 4,
        "alpha": 8.0,
        "dropout": 0.0,
        "target_modules": ["q_proj"],
    }


# --- verl ----------------------------------------------------------------------------------------


def test_verl_fully_async_overrides():
    kv = verl_overrides(export_verl(cfg(MODES["in_flight_keep"])))
    got = {k: v for k, v in kv.items() if k.startswith("async_training.")}
    assert set(got) <= VERL_ASYNC_KEYS
    assert got == {
        "async_training.staleness_threshold": "2.0",
        "async_training.trigger_parameter_sync_step": "1",
        "async_training.require_batches": "4",  # ppo_n_minibatches: one sync per step
        "async_training.partial_rollout": "True",
        "async_training.use_rollout_log_probs": "True",
    }
    bounded = verl_overrides(export_verl(cfg(MODES["bounded"])))
    assert bounded["async_training.partial_rollout"] == "False"
    assert not any(k.startswith("async_training.") for k in verl_overrides(export_verl(cfg())))
    text = export_verl(cfg({"max_staleness": 2, "max_concurrent": 3}))
    assert any(n.startswith("# rollout.asynchronous.max_concurrent=3: verl") for n in notes(text))


# --- TRL -----------------------------------------------------------------------------------------


def run_snippet(text: str) -> dict:
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's experimental and vLLM-version warnings
        exec(compile(text, "export", "exec"), namespace)  # noqa: S102 — the code under test
    return namespace


def test_trl_writes_an_async_grpo_config_that_builds():
    text = export_cell(cfg(MODES["partial"]), "trl")
    ns = run_snippet(text)
    a, g = ns["async_args"], ns["args"]
    assert type(a).__name__ == "AsyncGRPOConfig"
    assert a.max_staleness == 1
    assert a.max_inflight_tasks == ((1 + 1) * B + B) * N  # the harness's bound, in samples
    assert a.weight_sync_steps == 1 and a.token_budget == 0
    assert (a.num_generations, a.max_completion_length) == (N, 8)
    assert (a.epsilon, a.learning_rate) == (g.epsilon, g.learning_rate)
    assert "AsyncGRPOConfig has no beta, entropy_coef" in text


def test_the_shared_async_grpo_keys_are_fields_of_trls_class():
    from trl.experimental.async_grpo import AsyncGRPOConfig

    fields = {f.name for f in dataclasses.fields(AsyncGRPOConfig)}
    assert set(ASYNC_GRPO_SHARED) <= fields
    assert {"max_staleness", "max_inflight_tasks", "weight_sync_steps", "token_budget"} <= fields
    # what the snippet leaves to GRPOConfig is indeed missing from AsyncGRPOConfig
    assert not {"beta", "loss_type", "num_iterations", "steps_per_generation"} & fields


def test_synchronous_trl_export_has_no_async_block():
    assert "AsyncGRPOConfig" not in export_cell(cfg(), "trl")


# --- every target, every mode --------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_each_mode_exports_differently_and_names_the_clock(target):
    texts = {m: EXPORTERS[target](cfg(a)) for m, a in MODES.items()}
    assert len(set(texts.values())) == len(MODES), target
    for text in texts.values():
        assert any(n.startswith("# rollout.asynchronous.clock=virtual") for n in notes(text))
    threads = EXPORTERS[target](cfg({**MODES["bounded"], "clock": "threads"}))
    assert threads != texts["bounded"]


def test_cli_exports_an_async_cell_to_prime_rl(tmp_path: Path):
    exp = tmp_path / "a.yaml"
    exp.write_text(
        "name: a\nbase: {rollout: {prompts_per_step: 4, n_samples: 2}}\n"
        "grid: {rollout.async.max_staleness: [1, 3]}\nseeds: 1\nsteps: 2\n"
    )
    r = CliRunner().invoke(
        app, ["export", str(exp), "--cell", "max_staleness=3", "--to", "prime-rl"]
    )
    assert r.exit_code == 0, r.output
    body = "\n".join(ln for ln in r.output.splitlines() if not ln.startswith("#"))
    assert tomllib.loads(body)["max_async_level"] == 3
    bad = CliRunner().invoke(app, ["export", str(exp), "--cell", "x", "--to", "primerl"])
    assert bad.exit_code == 2
    assert "--to must be one of trl, verl, areal, prime-rl" in (bad.stderr or bad.output)
