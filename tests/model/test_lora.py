"""LoRA through peft: only adapters train, the KL reference is the base with adapters off (no
second copy), the behaviour ring holds adapter weights only, warm-start keys cover the config."""

from __future__ import annotations

import pytest
import torch

from harness.config import ConfigError, PPOActorConfig, build_run_config
from harness.model.build import LoraOptions, ModelOptions, load_model_and_tokenizer
from harness.model.logprobs import forward_logprobs
from harness.model.lora import prepare_for_training, reference_off, swapped_in, trainable_state
from harness.ppo.actor import PPOActor
from harness.run.loop import run
from harness.run.staleness import StalenessRing
from harness.sampling.local import sample

pytest.importorskip("peft")

PROMPTS = ["rev 1=", "rev 12345678=", "add 12+3="]
LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def lora_model(path, **lora):
    model, tok = load_model_and_tokenizer(str(path))
    opts = ModelOptions(lora=LoraOptions(**{**LORA, **lora}))
    return prepare_for_training(model, opts), tok


def one_update(model, tok, lr=1e-2):
    gen = torch.Generator().manual_seed(0)
    rb = sample(model, tok, PROMPTS, n_samples=2, max_new_tokens=6, generator=gen)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    actor = PPOActor(PPOActorConfig(ppo_n_minibatches=1), model, opt)
    batch = {
        "input_ids": rb.input_ids,
        "attention_mask": rb.attention_mask,
        "loss_mask": rb.loss_mask,
        "logprobs": rb.logprobs,
        "rewards": torch.arange(rb.batch_size, dtype=torch.float32),
        "group_sizes": rb.group_sizes,
    }
    actor.compute_advantages(batch)
    stats = actor.ppo_update(batch)
    assert stats["stability/optimizer_steps"] == 1.0
    return rb


@pytest.mark.parametrize("arch", ("qwen2", "gpt2"))
def test_only_adapters_train_and_reference_is_the_base(arch, hf_dirs):
    targets = ["c_attn"] if arch == "gpt2" else ["q_proj", "v_proj"]
    model, tok = lora_model(hf_dirs[arch], target_modules=targets)
    base, _ = load_model_and_tokenizer(str(hf_dirs[arch]))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rb = one_update(model, tok)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_B" in n or "lora_A" in n for n in changed)
    assert any("lora_B" in n for n in changed)
    with torch.no_grad():
        lp_base, _ = forward_logprobs(base, rb.input_ids, rb.attention_mask)
        with reference_off(model):
            lp_ref, _ = forward_logprobs(model, rb.input_ids, rb.attention_mask)
        lp_pol, _ = forward_logprobs(model, rb.input_ids, rb.attention_mask)
    m = rb.loss_mask.bool()
    assert (lp_ref - lp_base)[m].abs().max().item() < 1e-6  # reference == the base model
    assert (lp_pol - lp_base)[m].abs().max().item() > 1e-4  # the adapters did change the policy


def test_fresh_adapters_compute_the_base_and_sampling_agrees(hf_dirs):
    model, tok = lora_model(hf_dirs["mistral"])
    base, _ = load_model_and_tokenizer(str(hf_dirs["mistral"]))
    gen = torch.Generator().manual_seed(0)
    rb = sample(model, tok, PROMPTS, n_samples=2, max_new_tokens=6, generator=gen)
    gen = torch.Generator().manual_seed(0)
    rb_base = sample(base, tok, PROMPTS, n_samples=2, max_new_tokens=6, generator=gen)
    assert torch.equal(rb.input_ids, rb_base.input_ids)  # B = 0: same function, same samples
    lp, _ = forward_logprobs(model, rb.input_ids, rb.attention_mask)
    assert (lp - rb.logprobs)[rb.loss_mask.bool()].abs().max().item() < 1e-4


def test_ring_holds_adapters_only_and_swaps_them_back(hf_dirs):
    model, tok = lora_model(hf_dirs["qwen2"])
    ring = StalenessRing(1, trainable_only=True)
    ring.push(model)
    old = ring.behaviour_state()
    assert old and all("lora_" in n for n in old)
    n_adapter = sum(t.numel() for t in old.values())
    n_all = sum(p.numel() for p in model.parameters())
    assert n_adapter < n_all / 5
    one_update(model, tok)
    now = trainable_state(model)
    assert any(not torch.equal(now[n], old[n]) for n in now)
    params = dict(model.named_parameters())
    with swapped_in(model, old):
        assert all(torch.equal(params[n], old[n]) for n in old)
    assert all(torch.equal(params[n], now[n]) for n in now)


def test_lora_run_end_to_end_with_kl_staleness_and_critic(hf_dirs, tmp_path):
    cfg = build_run_config(
        {
            "steps": 3,
            "model": str(hf_dirs["qwen2"]),
            "task": "reverse",
            "model_options": {"lora": LORA, "gradient_checkpointing": True},
            "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 6, "staleness": 1},
            "ppo": {
                "ppo_n_minibatches": 2,
                "kl_ctl": 0.1,
                "use_decoupled_loss": True,
                "entropy_coef": 0.05,  # a gradient even when every reward is 0
            },
            "optim": {"lr": 1e-2},
            "critic": {"enabled": True},
            "eval": {"every": 0, "n_prompts": 4},
            "threads": 1,
        }
    )
    res = run(cfg, results_dir=tmp_path)
    assert res.status == "completed", res.reason
    h = res.history
    # Fresh adapters: policy == reference (up to sampler-vs-forward rounding).
    assert abs(h["objective/kl"][0]) < 1e-6
    assert abs(h["objective/kl"][-1]) > 1e-4  # after updates the adapters moved off the base
    # The lag each rollout sampled at, as with a full copy: step 0 had only the start weights.
    assert h["rollout/staleness"] == [0.0, 1.0, 1.0]


def test_warm_start_key_covers_the_adapter_config(hf_dirs, tmp_path):
    def key(r):
        cfg = build_run_config(
            {
                "steps": 1,
                "model": str(hf_dirs["qwen2"]),
                "model_options": {"lora": {**LORA, "r": r}},
                "warm_start": {"steps": 1, "batch_size": 2},
                "rollout": {"prompts_per_step": 1, "n_samples": 2, "max_new_tokens": 4},
                "eval": {"every": 0, "n_prompts": 2},
                "threads": 1,
            }
        )
        return run(cfg, results_dir=tmp_path).tags["warm_start.cache_key"]

    k4, k8 = key(4), key(8)
    assert k4 and k8 and k4 != k8
    assert key(4) == k4  # the same config hits the same cache entry


def test_bad_lora_options_are_one_line_errors(hf_dirs):
    with pytest.raises(ConfigError, match="lora.r"):
        build_run_config({"model_options": {"lora": {"r": 0}}})
    with pytest.raises(ConfigError, match="unknown key"):
        build_run_config({"model_options": {"lora": {"rank": 4}}})
    model, _ = load_model_and_tokenizer(str(hf_dirs["qwen2"]))
    with pytest.raises(ValueError, match="target_modules") as err:
        prepare_for_training(model, ModelOptions(lora=LoraOptions(target_modules=["nope"])))
    assert "\n" not in str(err.value)
