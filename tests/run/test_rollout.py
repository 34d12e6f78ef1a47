"""Sampling layout, behaviour log-prob consistency with the training forward, determinism."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from harness.model.build import build_model, build_tokenizer
from harness.model.logprobs import forward_logprobs, position_ids
from harness.run.staleness import StalenessRing
from harness.sampling.base import RolloutBatch
from harness.sampling.local import sample

PROMPTS = ["rev 1=", "rev 123456789=", "12+3="]  # different lengths: real left padding


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_model(tok, seed=0)


@pytest.fixture(scope="module")
def eos_model(tok):
    """A model whose EOS logit is inflated, so rows stop at varied steps (and some never do)."""
    m = build_model(tok, seed=0)
    with torch.no_grad():
        m.lm_head.weight[tok.eos_token_id] *= 10
    return m


def _sample(model, tok, seed=0, **kw) -> RolloutBatch:
    kw.setdefault("n_samples", 4)
    kw.setdefault("max_new_tokens", 12)
    return sample(model, tok, PROMPTS, generator=torch.Generator().manual_seed(seed), **kw)


def test_position_ids_start_at_zero_on_the_first_real_token():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert position_ids(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_layout_groups_masks_and_completions(eos_model, tok):
    b = _sample(eos_model, tok)
    n_rows = len(PROMPTS) * 4
    assert b.group_sizes == [4, 4, 4]
    assert b.input_ids.shape == b.attention_mask.shape == b.loss_mask.shape == b.logprobs.shape
    assert b.input_ids.shape[0] == n_rows
    width = b.prompt_width
    assert width == len("rev 123456789=")
    # Consecutive rows share a prompt; the prompt region is the left-padded prompt.
    enc = tok(PROMPTS, padding=True, return_tensors="pt")
    assert torch.equal(b.input_ids[:, :width], enc["input_ids"].repeat_interleave(4, 0))
    assert b.prompt_lens.tolist() == [6] * 4 + [14] * 4 + [5] * 4
    assert b.loss_mask[:, :width].sum() == 0 and b.logprobs[:, :width].abs().sum() == 0
    assert torch.equal(b.response_lens, b.loss_mask.sum(-1))
    assert torch.equal(b.attention_mask[:, width:], b.loss_mask[:, width:])
    eos = tok.eos_token_id
    # The fixture makes both kinds of rows.
    assert 0 < int(b.truncated.sum()) < n_rows
    for i in range(n_rows):
        gen = b.input_ids[i, width:].tolist()
        n = int(b.response_lens[i])
        real = gen[:n]
        assert all(t != tok.pad_token_id for t in real)
        assert all(t == tok.pad_token_id for t in gen[n:])
        assert (b.logprobs[i, width + n :] == 0).all() and (
            b.logprobs[i, width : width + n] < 0
        ).all()
        if b.truncated[i]:
            assert n == 12 and eos not in real
            assert b.completions[i] == tok.decode(real, skip_special_tokens=True)
        else:
            assert real[-1] == eos and eos not in real[:-1]
            assert b.completions[i] == tok.decode(real[:-1], skip_special_tokens=True)


def test_stops_early_when_every_row_is_done(tok):
    m = build_model(tok, seed=0)
    with torch.no_grad():
        m.lm_head.weight[tok.eos_token_id] *= 100  # EOS nearly always
    b = _sample(m, tok, max_new_tokens=50)
    assert b.input_ids.shape[1] < b.prompt_width + 50
    assert not b.truncated.any()


@pytest.mark.parametrize("backend", ["fast", "hf"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_match_training_forward(eos_model, model, tok, backend, temperature):
    """The PPO ratio's foundation: recomputed log-probs equal the sampled ones (< 1e-4)."""
    for m in (model, eos_model):
        b = _sample(m, tok, backend=backend, temperature=temperature, max_new_tokens=16)
        with torch.no_grad():
            lp, ent = forward_logprobs(
                m, b.input_ids, b.attention_mask, temperature=temperature, with_entropy=True
            )
        mask = b.loss_mask.bool()
        assert mask.sum() > 40
        assert (lp[mask] - b.logprobs[mask]).abs().max().item() < 1e-4
        assert ent is not None and ent.shape == lp.shape
        assert (ent[mask] > 0).all() and (
            ent[mask] <= torch.log(torch.tensor(len(tok))) + 1e-5
        ).all()


def test_forward_logprobs_is_invariant_to_left_padding(model, tok):
    b = _sample(model, tok, n_samples=1)
    with torch.no_grad():
        lp, ent = forward_logprobs(model, b.input_ids, b.attention_mask, with_entropy=True)
        row = 0  # the shortest prompt: heavily padded in the batch
        start = b.prompt_width - int(b.prompt_lens[row])
        ids = b.input_ids[row : row + 1, start:]
        lp1, ent1 = forward_logprobs(model, ids, torch.ones_like(ids), with_entropy=True)
    assert torch.allclose(lp[row, start + 1 :], lp1[0, 1:], atol=1e-5)
    assert ent is not None and ent1 is not None
    assert torch.allclose(ent[row, start + 1 :], ent1[0, 1:], atol=1e-5)
    assert lp[:, 0].abs().sum() == 0


def test_entropy_is_that_of_the_tempered_distribution(model, tok):
    ids = torch.tensor([tok("rev 12=")["input_ids"]])
    with torch.no_grad():
        lp, ent = forward_logprobs(
            model, ids, torch.ones_like(ids), temperature=0.5, with_entropy=True
        )
        logits = model(input_ids=ids).logits[0, 2] / 0.5
    p = logits.softmax(-1)
    assert ent is not None
    assert ent[0, 3].item() == pytest.approx(float(-(p * p.log()).sum()), abs=1e-5)
    assert lp[0, 3].item() == pytest.approx(float(p.log()[ids[0, 3]]), abs=1e-5)


def test_fast_and_hf_backends_sample_identical_tokens(eos_model, tok):
    a = _sample(eos_model, tok, backend="fast", seed=3)
    b = _sample(eos_model, tok, backend="hf", seed=3)
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_same_seed_same_samples_and_global_rng_untouched(model, tok):
    state = torch.get_rng_state()
    a = _sample(model, tok, seed=7, top_p=0.9)
    b = _sample(model, tok, seed=7, top_p=0.9)
    c = _sample(model, tok, seed=8, top_p=0.9)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.logprobs, b.logprobs)
    assert a.completions == b.completions
    assert not torch.equal(a.input_ids, c.input_ids)


def test_greedy_ignores_the_generator_and_tiny_top_p_is_greedy(model, tok):
    g1 = _sample(model, tok, seed=1, greedy=True, n_samples=3)
    g2 = _sample(model, tok, seed=2, greedy=True, n_samples=3)
    assert torch.equal(g1.input_ids, g2.input_ids)
    assert g1.completions[0] == g1.completions[1] == g1.completions[2]
    nucleus = _sample(model, tok, seed=5, top_p=1e-6, n_samples=3)
    assert torch.equal(nucleus.input_ids, g1.input_ids)


def test_batch_tensors_are_trainable(model, tok):
    b = _sample(model, tok).to("cpu")
    assert not any(
        t.is_inference() for t in (b.input_ids, b.attention_mask, b.loss_mask, b.logprobs)
    )
    lp, _ = forward_logprobs(model, b.input_ids, b.attention_mask)
    (lp * b.loss_mask).sum().backward()
    grad = model.lm_head.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)


def test_other_architectures_use_the_hf_path_consistently(tok):
    """GPT-2 (learned absolute positions) agrees too, because position_ids are explicit."""
    cfg = GPT2Config(
        vocab_size=len(tok), n_embd=64, n_layer=2, n_head=4, n_positions=128,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(0)
        m = GPT2LMHeadModel(cfg).eval()
    with pytest.raises(ValueError, match="no fast decoder"):
        _sample(m, tok, backend="fast")
    b = _sample(m, tok)
    with torch.no_grad():
        lp, _ = forward_logprobs(m, b.input_ids, b.attention_mask)
    mask = b.loss_mask.bool()
    assert (lp[mask] - b.logprobs[mask]).abs().max().item() < 1e-4


def test_argument_validation(model, tok):
    with pytest.raises(ValueError, match="temperature"):
        _sample(model, tok, temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        _sample(model, tok, top_p=0.0)
    with pytest.raises(ValueError, match="backend"):
        _sample(model, tok, backend="vllm")


def test_staleness_ring_serves_weights_k_updates_old(tok):
    m = build_model(tok, seed=0)
    ring = StalenessRing(2)
    assert ring.behaviour_state() is None
    for step in range(4):
        with torch.no_grad():
            m.lm_head.weight.fill_(float(step))
        ring.push(m)
    state = ring.behaviour_state()
    assert state is not None and ring.lag == 2
    assert state["lm_head.weight"].unique().tolist() == [1.0]  # pushed at step 1; newest is 3
    zero = StalenessRing(0)
    zero.push(m)
    assert zero.behaviour_state() is None and zero.lag == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_sampling_matches_training_forward(tok):
    m = build_model(tok, seed=0).to("cuda")
    b = sample(
        m, tok, PROMPTS, n_samples=4, max_new_tokens=16,
        generator=torch.Generator(device="cuda").manual_seed(0),
    )  # fmt: skip
    with torch.no_grad():
        lp, _ = forward_logprobs(m, b.input_ids, b.attention_mask)
    mask = b.loss_mask.bool()
    assert (lp[mask] - b.logprobs[mask]).abs().max().item() < 1e-3  # TF32 matmuls on GPU
