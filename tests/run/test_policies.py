"""The run's policies behind one interface: under a full copy and under LoRA alike, the behaviour
policy is the weights of ``staleness`` updates ago while sampling, the live weights come back
after it, and the KL reference is the start (full copy) or the base (LoRA)."""

from __future__ import annotations

import pytest
import torch

from harness.model.build import LoraOptions, ModelOptions, load_model_and_tokenizer
from harness.model.logprobs import forward_logprobs
from harness.model.lora import prepare_for_training
from harness.run.policies import Policies
from harness.sampling.local import sample

pytest.importorskip("peft")

PROMPTS = ["rev 1=", "rev 12345678=", "add 12+3="]


def _model(path, layout: str):
    model, tok = load_model_and_tokenizer(str(path))
    if layout == "lora":
        opts = ModelOptions(lora=LoraOptions(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
        model = prepare_for_training(model, opts)
    return model, tok


def _fake_update(model, seed: int) -> None:
    """Move every trainable weight (the adapters only, under LoRA) as an optimizer step would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))


def _lp(model, rb) -> torch.Tensor:
    with torch.no_grad():
        return forward_logprobs(model, rb.input_ids, rb.attention_mask)[0]


@pytest.mark.parametrize("layout", ["full", "lora"])
def test_behaviour_lags_by_staleness_and_the_reference_stays_at_the_start(layout, hf_dirs):
    model, tok = _model(hf_dirs["qwen2"], layout)
    gen = torch.Generator().manual_seed(0)
    rb = sample(model, tok, PROMPTS, n_samples=2, max_new_tokens=6, generator=gen)
    m = rb.loss_mask.bool()
    start = _lp(model, rb)
    pol = Policies(model, kl=True, staleness=2)
    assert not model.training  # eval mode outside the update

    seen = [start]
    for version in (1, 2, 3):
        _fake_update(model, seed=version)
        pol.push()
        seen.append(_lp(model, rb))
        assert pol.version == version and pol.lag == min(version, 2)
        with pol.behaviour() as b:
            assert b.stale and b.version == version - pol.lag
            # the weights that sample are the policy `lag` updates ago, exactly
            assert torch.equal(_lp(b.module, rb)[m], seen[b.version][m])
        # the live weights are back (under LoRA they were swapped out for the block)
        assert torch.equal(_lp(model, rb)[m], seen[version][m])
        assert not torch.equal(seen[version][m], seen[b.version][m])
        with torch.no_grad():
            ref = pol.reference_logprobs(rb.input_ids, rb.attention_mask, temperature=1.0)
        # full copy: the start; LoRA: the base with the adapters off, which is the start (B = 0)
        assert (ref - start)[m].abs().max().item() < 1e-6


def test_without_staleness_the_live_model_samples_and_without_kl_there_is_no_reference(hf_dirs):
    model, _ = _model(hf_dirs["qwen2"], "full")
    pol = Policies(model, kl=False, staleness=0)
    _fake_update(model, seed=0)
    pol.push()
    with pol.behaviour() as b:
        assert b.module is model and not b.stale and b.version == 1
    ids = torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(RuntimeError, match="no KL reference"):
        pol.reference_logprobs(ids, torch.ones_like(ids), temperature=1.0)
