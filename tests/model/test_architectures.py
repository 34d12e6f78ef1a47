"""Any local HF causal LM trains correctly: seven architectures built in code (tests/support/hf_archs.py),
loaded as ``model=<dir>`` exactly as a user's model directory."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from harness.config import ConfigError, build_run_config, load_run_config
from harness.model.build import disable_dropout, eos_ids, load_model_and_tokenizer
from harness.model.critic import ValueModel
from harness.model.logprobs import forward_logprobs
from harness.run.loop import run
from harness.sampling.local import sample
from tests.support.hf_archs import ARCHS, POSITIONS

WITH_DROPOUT = ("gpt2", "opt", "qwen2", "gpt_neox", "phi")
PROMPTS = ["rev 1=", "rev 12345678=", "add 12+3="]  # different lengths: real left padding


def small_cfg(path, **over):
    base = {
        "steps": 2,
        "model": str(path),
        "task": "reverse",
        "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 6},
        # One optimizer step on the recomputed log-probs: the ratio must be exactly 1.
        "ppo": {"ppo_n_minibatches": 1, "recompute_logprob": True, "kl_ctl": 0.05},
        "critic": {"enabled": True},
        "eval": {"every": 0, "n_prompts": 4},
        "threads": 1,
    }
    return build_run_config(base, over)


@pytest.mark.parametrize("arch", ARCHS)
def test_run_trains_with_ratio_exactly_one_and_a_critic(arch, hf_dirs, tmp_path):
    res = run(small_cfg(hf_dirs[arch]), results_dir=tmp_path)
    assert res.status == "completed", res.reason
    h = res.history
    assert h["policy/ratio_min"][0] == 1.0 and h["policy/ratio_max"][0] == 1.0
    assert h["policy/approx_kl"][0] == 0.0
    assert all(v > 0 for v in h["critic/value_loss"])
    assert h["stability/optimizer_steps"] == [1.0, 1.0]


@pytest.mark.parametrize("arch", ARCHS)
def test_sampled_and_recomputed_logprobs_agree_with_left_padding(arch, hf_dirs):
    model, tok = load_model_and_tokenizer(str(hf_dirs[arch]))
    model.train()  # dropout is zeroed at load: train mode must not change the function
    gen = torch.Generator().manual_seed(0)
    rb = sample(model, tok, PROMPTS, n_samples=2, max_new_tokens=8, generator=gen)
    assert (rb.attention_mask[:, 0] == 0).any()  # some rows really are left-padded
    lp, _ = forward_logprobs(model, rb.input_ids, rb.attention_mask)
    m = rb.loss_mask.bool()
    assert int(m.sum()) > 6
    assert (lp - rb.logprobs)[m].abs().max().item() < 1e-4


@pytest.mark.parametrize("arch", WITH_DROPOUT)
def test_checkpoint_dropout_is_zeroed_at_load(arch, hf_dirs):
    from transformers import AutoModelForCausalLM

    raw = AutoModelForCausalLM.from_pretrained(str(hf_dirs[arch]), attn_implementation="eager")
    assert disable_dropout(raw) > 0  # the saved config really has dropout 0.1
    model, _ = load_model_and_tokenizer(str(hf_dirs[arch]))
    assert disable_dropout(model) == 0  # nothing left to zero after load_model


@pytest.mark.parametrize("arch", ("gpt2", "opt"))
def test_live_dropout_would_break_the_ratio(arch, hf_dirs):
    """The control for the ratio test: with the checkpoint's dropout live, two train-mode
    forwards of the same weights disagree (so the exact-1 check above can fail)."""
    from transformers import AutoModelForCausalLM

    raw = AutoModelForCausalLM.from_pretrained(str(hf_dirs[arch]), attn_implementation="eager")
    raw.train()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    att = torch.ones_like(ids)
    a, _ = forward_logprobs(raw, ids, att)
    b, _ = forward_logprobs(raw, ids, att)
    assert (a - b).abs().max().item() > 1e-3


@pytest.mark.parametrize("arch", ("gpt2", "gpt_neox", "opt"))
def test_critic_uses_any_trunk(arch, hf_dirs):
    model, tok = load_model_and_tokenizer(str(hf_dirs[arch]))
    critic = ValueModel(model)
    enc = tok(PROMPTS, padding=True, return_tensors="pt")
    v = critic(enc["input_ids"], enc["attention_mask"])
    assert v.shape == enc["input_ids"].shape and torch.all(v == 0)  # zero-initialised head
    critic.head.bias.data.fill_(1.0)
    assert torch.allclose(critic(enc["input_ids"], enc["attention_mask"]), torch.ones(v.shape))


@pytest.mark.parametrize("arch", ARCHS)
def test_too_long_is_a_one_line_config_error(arch, hf_dirs):
    with pytest.raises(ConfigError) as err:
        load_run_config(None, [f"model={hf_dirs[arch]}", f"rollout.max_new_tokens={POSITIONS - 2}"])
    msg = str(err.value)
    assert "\n" not in msg and "rollout.max_new_tokens" in msg and f"{POSITIONS} positions" in msg
    # Truncating prompts makes the same length fit.
    cfg = load_run_config(
        None,
        [
            f"model={hf_dirs[arch]}",
            f"rollout.max_new_tokens={POSITIONS - 8}",
            "rollout.max_prompt_tokens=8",
        ],
    )
    assert cfg.rollout.max_prompt_tokens == 8


def test_too_long_cli_exits_2_with_one_line_and_writes_nothing(hf_dirs, tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--results-dir", str(out)]
        + ["--set", f"model={hf_dirs['gpt2']}", "--set", "rollout.max_new_tokens=140"],
        capture_output=True,
        text=True,
        timeout=600,  # against a hang only: a harness start takes 9 s idle, 30 s and more loaded
    )
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "max_new_tokens" in lines[0] and "Traceback" not in proc.stderr
    assert not out.exists()


def test_prompt_truncation_keeps_the_end(hf_dirs):
    model, tok = load_model_and_tokenizer(str(hf_dirs["qwen2"]))
    gen = torch.Generator().manual_seed(0)
    rb = sample(
        model, tok, PROMPTS, n_samples=1, max_new_tokens=2, generator=gen, max_prompt_tokens=3
    )
    assert rb.prompt_width == 3 and int(rb.prompt_lens.max()) == 3
    full = tok(PROMPTS[1])["input_ids"]
    assert rb.input_ids[1, :3].tolist() == full[-3:]
    with pytest.raises(ValueError, match="positions"):
        sample(model, tok, PROMPTS, n_samples=1, max_new_tokens=60, generator=gen, max_positions=64)


def test_stops_on_any_eos_id(hf_dirs):
    model, tok = load_model_and_tokenizer(str(hf_dirs["mistral"]))
    model.generation_config.eos_token_id = [2, 7]
    assert eos_ids(model, tok) == [2, 7]
    gen = torch.Generator().manual_seed(0)
    every = list(range(len(tok)))
    rb = sample(
        model, tok, PROMPTS, n_samples=2, max_new_tokens=8, generator=gen, eos_token_ids=every
    )
    assert rb.response_lens.tolist() == [1] * 6 and not rb.truncated.any()
    # Default EOS set comes from generation_config: a row ending in 7 counts as finished.
    rb = sample(model, tok, PROMPTS * 4, n_samples=4, max_new_tokens=12, generator=gen)
    for row, n, trunc in zip(
        rb.input_ids[:, rb.prompt_width :], rb.response_lens, rb.truncated, strict=True
    ):
        toks = row[: int(n)].tolist()
        if not trunc:
            assert toks[-1] in (2, 7) and not set(toks[:-1]) & {2, 7}


@pytest.mark.parametrize("arch", ("gpt2", "qwen2"))
def test_bfloat16_runs_on_cpu_with_one_precision(arch, hf_dirs, tmp_path):
    """Sampler and update under the same bf16 autocast: the first-update ratio stays 1 to bf16
    rounding on the recomputed log-probs (exactly, since recompute and update share the pass)."""
    res = run(small_cfg(hf_dirs[arch], **{"model_options.dtype": "bfloat16"}), results_dir=tmp_path)
    assert res.status == "completed", res.reason
    assert res.history["policy/ratio_min"][0] == 1.0 == res.history["policy/ratio_max"][0]
    model, tok = load_model_and_tokenizer(str(hf_dirs[arch]))
    from harness.model.build import precision

    gen = torch.Generator().manual_seed(0)
    with precision("cpu", torch.bfloat16):
        rb = sample(model, tok, PROMPTS, n_samples=2, max_new_tokens=6, generator=gen)
        lp_bf, _ = forward_logprobs(model, rb.input_ids, rb.attention_mask)
    lp_32, _ = forward_logprobs(model, rb.input_ids, rb.attention_mask)
    m = rb.loss_mask.bool()
    # Same precision in both passes agrees far better than bf16 vs float32 does.
    same = (lp_bf - rb.logprobs)[m].abs().max().item()
    mixed = (lp_32 - rb.logprobs)[m].abs().max().item()
    assert same < 0.05 and mixed > same


@pytest.mark.parametrize("arch", ("qwen2", "mistral"))
def test_fast_decoder_covers_qwen2_and_mistral_exactly(arch, hf_dirs):
    model, tok = load_model_and_tokenizer(str(hf_dirs[arch]))
    runs = {}
    for backend in ("fast", "hf"):
        gen = torch.Generator().manual_seed(3)
        runs[backend] = sample(
            model, tok, PROMPTS, n_samples=3, max_new_tokens=10, generator=gen, backend=backend
        )
    a, b = runs["fast"], runs["hf"]
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)
    lp, _ = forward_logprobs(model, a.input_ids, a.attention_mask)
    m = a.loss_mask.bool()
    assert (lp - a.logprobs)[m].abs().max().item() < 1e-4
    model.model.layers[0].self_attn.sliding_window = 4  # a sliding window masks differently
    with pytest.raises(ValueError, match="no fast decoder"):
        sample(model, tok, PROMPTS, n_samples=1, max_new_tokens=2,
               generator=torch.Generator(), backend="fast")  # fmt: skip


@pytest.mark.parametrize("arch", ("gpt2", "gemma2", "phi", "gpt_neox", "opt"))
def test_other_architectures_refuse_the_fast_decoder(arch, hf_dirs):
    model, tok = load_model_and_tokenizer(str(hf_dirs[arch]))
    with pytest.raises(ValueError, match="no fast decoder"):
        sample(model, tok, PROMPTS, n_samples=1, max_new_tokens=2,
               generator=torch.Generator(), backend="fast")  # fmt: skip
