"""Chunked selected log-probs and entropies: golden numbers, the textbook reference, gradients."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.model.logprobs import chunk_rows, naive_selected_logprobs, selected_logprobs


def test_golden_numbers():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    lp, ent = selected_logprobs(logits, torch.tensor([0, 1]), with_entropy=True)
    # Row 0 uniform over 2: log 1/2, entropy log 2. Row 1: p = (3/4, 1/4).
    assert torch.allclose(lp, torch.tensor([math.log(0.5), math.log(0.25)]), atol=1e-7)
    h1 = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert torch.allclose(ent, torch.tensor([math.log(2.0), h1]), atol=1e-7)
    lp2, _ = selected_logprobs(logits, torch.tensor([0, 1]), temperature=2.0)
    # T = 2 on row 1: x = (log 3 / 2, 0) -> p = (√3, 1) / (√3 + 1).
    assert abs(float(lp2[1]) - math.log(1 / (math.sqrt(3) + 1))) < 1e-7


def test_matches_the_textbook_version_values_and_gradients_across_chunks():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=g) * 3
    tgt = torch.randint(0, 50, (3, 7), generator=g)
    w_lp, w_ent = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)
    ref_in = logits.clone().requires_grad_(True)
    lp_r, ent_r = naive_selected_logprobs(ref_in, tgt, temperature=0.7, with_entropy=True)
    ((lp_r * w_lp).sum() + (ent_r * w_ent).sum()).backward()
    for chunk in (1, 4, 21, 1000):
        x = logits.clone().requires_grad_(True)
        lp, ent = selected_logprobs(x, tgt, temperature=0.7, with_entropy=True, chunk=chunk)
        ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
        assert torch.allclose(lp, lp_r, atol=1e-6) and torch.allclose(ent, ent_r, atol=1e-5)
        assert torch.allclose(x.grad, ref_in.grad, atol=1e-6, rtol=1e-4), chunk


def test_gradcheck_in_double():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 6, dtype=torch.float64, generator=g, requires_grad=True)
    tgt = torch.randint(0, 6, (5,), generator=g)

    def f(z):  # the function computes in float32: gradcheck the float64 chain via naive grad
        return selected_logprobs(z, tgt, with_entropy=True, chunk=2)

    lp, ent = f(x)
    (lp.sum() + 0.5 * ent.sum()).backward()
    ref = x.detach().clone().requires_grad_(True)
    lp_r, ent_r = naive_selected_logprobs(ref, tgt, with_entropy=True)
    (lp_r.sum() + 0.5 * ent_r.sum()).backward()
    assert torch.allclose(x.grad, ref.grad, atol=1e-6)


def test_bf16_logits_get_bf16_gradients():
    x = torch.randn(4, 30).to(torch.bfloat16).requires_grad_(True)
    lp, _ = selected_logprobs(x, torch.zeros(4, dtype=torch.long))
    assert lp.dtype == torch.float32
    lp.sum().backward()
    assert x.grad.dtype == torch.bfloat16


def test_chunk_rows():
    assert chunk_rows(100) == (1 << 24) // 100 and chunk_rows(151_936) == 110
    assert chunk_rows(10**9) == 1


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 6),
    v=st.integers(2, 40),
    scale=st.floats(0.1, 20.0),
    temp=st.floats(0.3, 3.0),
    seed=st.integers(0, 10_000),
)
def test_properties(n, v, scale, temp, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, v, generator=g) * scale
    tgt = torch.randint(0, v, (n,), generator=g)
    lp, ent = selected_logprobs(logits, tgt, temperature=temp, with_entropy=True, chunk=2)
    assert (lp <= 1e-6).all()
    assert (ent >= -1e-5).all() and (ent <= math.log(v) + 1e-5).all()
    # Shifting every logit of a row by a constant changes nothing.
    lp2, ent2 = selected_logprobs(logits + 5.0, tgt, temperature=temp, with_entropy=True)
    assert torch.allclose(lp, lp2, atol=1e-4, rtol=1e-5)
    assert torch.allclose(ent, ent2, atol=1e-4, rtol=1e-5)
