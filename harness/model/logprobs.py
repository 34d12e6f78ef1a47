"""Selected-token log-probs and entropies of a ``[N, V]`` logits matrix, in row chunks.

Why: the textbook ``log_softmax(logits.float() / T).gather(...)`` materialises (and autograd
keeps) a float32 ``[N, V]`` tensor, plus two more of the same size for the entropy
(``p = exp(logp)``, ``p * logp``). With a Qwen2-like vocabulary (V = 152k) and N = 32 x 32 tokens
that is ~620 MB each. Here the forward pass walks ``chunk`` rows at a time and keeps only
``[N]`` results; the backward pass recomputes each chunk's softmax from the logits (which the
model's output holds anyway) and writes the gradient straight into one ``[N, V]`` buffer of the
logits' dtype. Same numbers as the textbook version (tested to 1e-6 in float32, gradients too).

Math (x = logits / T, y = target id; standard results, e.g. Goodfellow et al., *Deep Learning*,
§6.2.2.3, and the entropy gradient of any softmax):

    lse     = logsumexp_v x_v
    lp      = x_y − lse                               ∂lp/∂x_v = 1[v = y] − p_v
    H       = lse − Σ_v p_v x_v = −Σ_v p_v log p_v     ∂H/∂x_v  = −p_v (log p_v + H)

and ∂/∂logits = (∂/∂x) / T.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Floats of one float32 chunk: 2^24 = 64 MiB. A 100-token vocabulary fits 167k rows in one
# chunk (the tiny model never loops); a 152k vocabulary takes 110 rows per chunk.
CHUNK_ELEMENTS = 1 << 24


def chunk_rows(vocab: int, elements: int = CHUNK_ELEMENTS) -> int:
    return max(1, elements // max(vocab, 1))


class _SelectedLogProb(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        inv_t: float,
        with_entropy: bool,
        chunk: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = logits.shape[0]
        lp = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(lp)
        ent = torch.empty_like(lp) if with_entropy else lp.new_zeros(0)
        for s in range(0, n, chunk):
            x = logits[s : s + chunk].float()
            if inv_t != 1.0:
                x = x * inv_t
            z = torch.logsumexp(x, dim=-1)
            lse[s : s + chunk] = z
            lp[s : s + chunk] = x.gather(-1, targets[s : s + chunk, None]).squeeze(-1) - z
            if with_entropy:  # −Σ p·log p, not lse − Σ p·x: no cancellation when peaked
                logp = x - z[:, None]
                ent[s : s + chunk] = -(torch.exp(logp) * logp).sum(-1)
        ctx.save_for_backward(logits, targets, lse, ent)
        ctx.inv_t, ctx.with_entropy, ctx.chunk = inv_t, with_entropy, chunk
        return lp, ent

    @staticmethod
    def backward(ctx: Any, g_lp: torch.Tensor, g_ent: torch.Tensor) -> Any:  # type: ignore[override]
        logits, targets, lse, ent = ctx.saved_tensors
        inv_t, chunk = ctx.inv_t, ctx.chunk
        grad = torch.empty_like(logits)
        for s in range(0, logits.shape[0], chunk):
            x = logits[s : s + chunk].float()
            if inv_t != 1.0:
                x = x * inv_t
            logp = x - lse[s : s + chunk, None]
            p = torch.exp(logp)
            gl = g_lp[s : s + chunk, None]
            g = -p * gl
            g.scatter_add_(-1, targets[s : s + chunk, None], gl)
            if ctx.with_entropy and g_ent is not None and g_ent.numel():
                g -= p * (logp + ent[s : s + chunk, None]) * g_ent[s : s + chunk, None]
            if inv_t != 1.0:
                g *= inv_t
            grad[s : s + chunk] = g.to(logits.dtype)
        return grad, None, None, None, None


def selected_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(logits / T)[targets]`` and (optionally) the entropy, per row, float32.

    ``logits``: ``[..., V]`` (any float dtype, contiguous for a free reshape); ``targets``:
    ``[...]`` ids. Returns tensors of shape ``[...]``; differentiable w.r.t. ``logits``.
    """
    lead = logits.shape[:-1]
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    rows = chunk or chunk_rows(vocab)
    lp, ent = _SelectedLogProb.apply(
        flat, targets.reshape(-1), 1.0 / temperature, with_entropy, rows
    )
    return lp.view(lead), (ent.view(lead) if with_entropy else None)


def naive_selected_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The textbook reference (full float32 ``log_softmax``), for tests and the benchmark."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1) if with_entropy else None
    return lp, ent


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """RoPE positions for a left-padded batch: 0 at each row's first real token, 0 on padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)


def forward_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Training-time log-probs (and entropies) in token layout, with gradients unless disabled.

    ``logprobs[:, j] = log softmax(logits[:, j-1] / temperature)[input_ids[:, j]]``, 0 at j = 0;
    ``entropy[:, j]`` is the entropy of that same tempered distribution. Same ``position_ids``
    convention as :func:`sample`, so on a sampled batch this reproduces the behaviour log-probs.
    Values at padded positions are meaningless; multiply by a mask.
    """
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        use_cache=False,
    )
    # Chunked log-softmax (harness.model.logprobs): no float32 [B, L, V] copy. The whole logits tensor
    # goes in (a free reshape; slicing off the last position first would copy it), with each
    # position's target being the next token; the last position's value is dropped.
    targets = torch.roll(input_ids, shifts=-1, dims=1)
    tok_lp, ent = selected_logprobs(
        out.logits, targets, temperature=temperature, with_entropy=with_entropy
    )
    pad = tok_lp.new_zeros(input_ids.shape[0], 1)
    logprobs = torch.cat([pad, tok_lp[:, :-1]], dim=1)
    entropy = torch.cat([pad, ent[:, :-1]], dim=1) if ent is not None else None
    return logprobs, entropy


__all__ = [
    "chunk_rows",
    "forward_logprobs",
    "naive_selected_logprobs",
    "position_ids",
    "selected_logprobs",
]
