"""Sampling for PPO: a lean KV-cache loop that records behaviour log-probs, and the matching
training-time forward pass.

Why not ``model.generate``: for a 2-layer model the per-token cost is Python overhead, and
``generate`` adds a logits-processor pipeline, stopping criteria, cache bookkeeping and output
objects on every step. The loop below does one forward for the prompts and one per new token,
samples with an explicit ``torch.Generator`` (so a run's sampling stream is reproducible and
independent of the global RNG), and stops as soon as every row has emitted EOS. For a plain
``LlamaForCausalLM`` (the tiny model), ``Qwen2ForCausalLM`` or ``MistralForCausalLM`` (no sliding
window) each step goes through :class:`~harness.run.decoders._LlamaDecoder`, a
functional replay of the same weights over preallocated KV buffers (about 2x faster per token
than calling the HF module); any other causal LM goes through its own ``forward`` with a
``DynamicCache``. Both paths sample identical tokens for the same generator (tested).

Layout ("token layout", shared by everything downstream): a batch is ``[B, L]`` with
``L = P + T``: each row is its left-padded prompt (width ``P``, the longest prompt), then its
response, then right padding (pad id) up to ``T`` (the longest response). Per-token quantities
live at the position of the token they describe: ``logprobs[b, j]`` is
log pi(input_ids[b, j] | prefix), ``loss_mask[b, j]`` is 1 exactly on generated tokens (EOS
included when produced); ``attention_mask`` is the prompt mask followed by ``loss_mask``. Rows
come in groups: the ``n_samples`` samples of prompt i are rows ``i*n .. i*n+n-1``.
``completions`` are decoded up to EOS (exclusive) with ``skip_special_tokens=True``.

Positions: left padding shifts where each row's text starts, so both the sampler and
:func:`forward_logprobs` pass explicit ``position_ids = clamp(cumsum(attention_mask) - 1, 0)``:
the first real token of every row is at position 0 whatever the padding. With RoPE the two passes
then agree to float32 rounding (a test checks max |diff| < 1e-4 on every generated token).

Behaviour log-probs are those of the tempered, untruncated distribution
``log_softmax(logits / temperature)`` (what :func:`forward_logprobs` recomputes). With
``top_p < 1`` tokens are drawn from the nucleus-renormalised distribution, so the recorded
log-probs are slightly off the true sampling distribution (as in verl/AReaL); keep ``top_p = 1``
for exact on-policy ratios.

The loop runs under ``torch.inference_mode``; the returned batch is assembled outside it, so its
tensors are ordinary tensors that the training pass can use under autograd.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from harness.model.build import eos_ids
from harness.model.logprobs import forward_logprobs, position_ids
from harness.model.prompting import apply_chat_template
from harness.run.decoders import _fast_path_ok, _HFDecoder, _LlamaDecoder


class NonFiniteLogits(FloatingPointError):
    """The policy's logits stopped being finite while sampling (a diverged policy)."""


@dataclass
class RolloutBatch:
    """Sampled sequences in token layout (see the module docstring); all tensors are ``[B, L]``
    unless noted, ``B = len(prompts) * n_samples``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    logprobs: torch.Tensor
    prompt_lens: torch.Tensor  # [B] real (unpadded) prompt tokens
    response_lens: torch.Tensor  # [B] generated tokens, EOS included
    truncated: torch.Tensor  # [B] bool: hit max_new_tokens without EOS
    completions: list[str] = field(default_factory=list)  # decoded, up to EOS (exclusive)
    group_sizes: list[int] = field(default_factory=list)  # n_samples per prompt, in row order
    prompt_width: int = 0  # P: the column where responses start

    def to(self, device: torch.device | str) -> RolloutBatch:
        """A copy with every tensor on ``device`` (lists and ints are shared)."""
        moved: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            moved[f.name] = v.to(device) if isinstance(v, torch.Tensor) else v
        return RolloutBatch(**moved)

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail outside the smallest set of tokens whose mass reaches ``top_p``."""
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    cum = sorted_p.cumsum(-1)
    drop = (cum - sorted_p) >= top_p  # keep the token that crosses the threshold
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(-1, idx, sorted_p)


@torch.inference_mode()
def _generate(
    model: PreTrainedModel,
    fast: bool,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    generator: torch.Generator,
    temperature: float,
    top_p: float,
    greedy: bool,
    eos: torch.Tensor,
    pad_id: int,
    logit_noise: float = 0.0,
    noise_generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampling loop: ``[N, T]`` tokens (pad after EOS) and their behaviour log-probs.

    ``logit_noise`` σ > 0 adds N(0, σ²) noise from ``noise_generator`` to every step's logits
    before the distribution is formed, so the tokens AND the recorded log-probs are the noisy
    sampler's (an emulated mismatch source; its own generator leaves the sampling stream alone).
    """
    n_rows = prompt_ids.shape[0]
    device = prompt_ids.device
    inv_t = 1.0 / temperature
    decoder: _HFDecoder | _LlamaDecoder
    if fast:
        decoder = _LlamaDecoder(model, prompt_mask, max_new_tokens)  # type: ignore[arg-type]
    else:
        decoder = _HFDecoder(model, prompt_mask, max_new_tokens)
    # Preallocated outputs: the loop writes one column per step and allocates little else.
    tokens = torch.full((n_rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logps = torch.zeros(n_rows, max_new_tokens, dtype=torch.float32, device=device)
    alive = torch.ones(n_rows, dtype=torch.bool, device=device)
    pos = position_ids(prompt_mask)
    logits = decoder.prefill(prompt_ids, pos)
    next_pos = pos[:, -1:] + 1
    steps = 0
    for t in range(max_new_tokens):
        if logit_noise > 0:
            noise = torch.randn(
                logits.shape, generator=noise_generator, device=device, dtype=torch.float32
            )
            logits = logits.float() + logit_noise * noise
        logp = torch.log_softmax(logits.float() * inv_t, dim=-1)
        if greedy:
            tok = logp.argmax(dim=-1, keepdim=True)
        else:
            probs = logp.exp()
            if top_p < 1.0:
                probs = _top_p_filter(probs, top_p)
            try:
                tok = torch.multinomial(probs, 1, generator=generator)
            except RuntimeError:
                # Divergence only when the numbers are: any other failure (out of memory, a
                # device or library error) is the caller's error, not a result of the run.
                if not bool(torch.isfinite(logits).all()):
                    raise NonFiniteLogits(f"non-finite logits at new token {t}") from None
                raise
        lp = logp.gather(-1, tok).squeeze_(-1)
        tok = tok.squeeze_(-1)
        tokens[:, t] = torch.where(alive, tok, pad_id)
        logps[:, t] = torch.where(alive, lp, 0.0)
        alive &= ~torch.isin(tok, eos)
        steps = t + 1
        if t + 1 == max_new_tokens or not bool(alive.any()):
            break
        logits = decoder.step(tokens[:, t : t + 1], next_pos, t)
        next_pos = next_pos + 1

    return tokens[:, :steps], logps[:, :steps]


def sample(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    n_samples: int,
    max_new_tokens: int,
    generator: torch.Generator,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    backend: str = "auto",
    eos_token_ids: list[int] | None = None,
    max_prompt_tokens: int | None = None,
    max_positions: int | None = None,
    chat_template: str | None = None,
    logit_noise: float = 0.0,
    noise_generator: torch.Generator | None = None,
) -> RolloutBatch:
    """Sample ``n_samples`` completions per prompt with a hand-written KV-cache loop.

    ``generator`` must live on the model's device; the same weights, prompts and generator state
    give identical samples. ``greedy=True`` takes the argmax (for evaluation) and ignores the
    generator. Rows that emit EOS stop (their later slots are padding); the loop ends when all
    rows are done or after ``max_new_tokens``. ``backend``: ``"auto"`` uses the functional Llama
    decoder when it applies and the model's own forward otherwise; ``"hf"`` forces the latter,
    ``"fast"`` insists on the former.

    ``eos_token_ids``: every id that ends a completion (default: the model's
    :func:`harness.model.build.eos_ids`). ``max_prompt_tokens``: keep only the last that many tokens of
    a longer prompt (None = never truncate). ``max_positions``: a row needing more than that many
    positions (prompt + ``max_new_tokens``) raises ``ValueError`` before any forward pass.
    ``chat_template``: a Jinja template each prompt is rendered with first (one user turn; see
    :mod:`harness.model.prompting`). ``logit_noise``: σ of Gaussian noise on the logits (drawn
    from ``noise_generator``, required when σ > 0), see :func:`_generate`.
    """
    if n_samples < 1 or max_new_tokens < 1:
        raise ValueError("sample: n_samples and max_new_tokens must be >= 1")
    if temperature <= 0:
        raise ValueError(f"sample: temperature must be > 0; got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"sample: top_p must be in (0, 1]; got {top_p}")
    if backend not in ("auto", "fast", "hf"):
        raise ValueError(f"sample: backend must be auto, fast or hf; got {backend!r}")
    if logit_noise < 0 or (logit_noise > 0 and noise_generator is None):
        raise ValueError("sample: logit_noise must be >= 0, and > 0 needs a noise_generator")
    fast = backend != "hf" and _fast_path_ok(model)
    if backend == "fast" and not fast:
        raise ValueError(f"sample: no fast decoder for {type(model).__name__}; use backend='auto'")
    device = next(model.parameters()).device
    if eos_token_ids is None:
        eos_token_ids = eos_ids(model, tokenizer)
    eos_id = eos_token_ids[0]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    enc = encode_prompts(tokenizer, prompts, max_prompt_tokens, chat_template)
    prompt_ids = enc["input_ids"].to(device).repeat_interleave(n_samples, dim=0)
    prompt_mask = enc["attention_mask"].to(device).repeat_interleave(n_samples, dim=0)
    longest = int(prompt_mask.sum(-1).max())
    if max_positions is not None and longest + max_new_tokens > max_positions:
        raise ValueError(
            f"rollout: a prompt of {longest} tokens + max_new_tokens {max_new_tokens} exceeds "
            f"the model's {max_positions} positions (set rollout.max_prompt_tokens)"
        )
    eos = torch.tensor(eos_token_ids, dtype=torch.long, device=device)

    tokens, logps = _generate(
        model,
        fast,
        prompt_ids,
        prompt_mask,
        max_new_tokens=max_new_tokens,
        generator=generator,
        temperature=temperature,
        top_p=top_p,
        greedy=greedy,
        eos=eos,
        pad_id=pad_id,
        logit_noise=logit_noise,
        noise_generator=noise_generator,
    )
    # Everything below runs outside inference mode: the batch's tensors are ordinary tensors
    # that the training forward pass may use under autograd.
    return assemble_batch(
        tokenizer,
        prompt_ids,
        prompt_mask,
        tokens,
        logps,
        eos,
        group_sizes=[n_samples] * len(prompts),
    )


def assemble_batch(
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    tokens: torch.Tensor,
    logps: torch.Tensor,
    eos: torch.Tensor,
    *,
    group_sizes: list[int],
) -> RolloutBatch:
    """The :class:`RolloutBatch` of sampled ``tokens`` ``[N, T]`` (pad after EOS) and their
    behaviour log-probs ``logps`` behind left-padded prompts ``[N, P]``: the one place the
    token layout is built, whichever sampler produced the tokens."""
    n_rows, width = prompt_ids.shape
    # A generated slot is real up to and including the first EOS.
    is_eos = torch.isin(tokens, eos)
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    gen_mask = (~after_eos).to(prompt_mask.dtype)
    response_lens = gen_mask.sum(-1)
    truncated = ~is_eos.any(-1)
    return RolloutBatch(
        input_ids=torch.cat([prompt_ids, tokens], dim=1),
        attention_mask=torch.cat([prompt_mask, gen_mask], dim=1),
        loss_mask=torch.cat([torch.zeros_like(prompt_mask), gen_mask], dim=1),
        logprobs=torch.cat([logps.new_zeros(n_rows, width), logps * gen_mask], dim=1),
        prompt_lens=prompt_mask.sum(-1),
        response_lens=response_lens,
        truncated=truncated,
        completions=_decode(tokenizer, tokens, response_lens, truncated),
        group_sizes=group_sizes,
        prompt_width=width,
    )


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    max_prompt_tokens: int | None = None,
    chat_template: str | None = None,
) -> dict[str, torch.Tensor]:
    """Left-padded prompt ids and mask; with ``max_prompt_tokens`` each prompt keeps only its
    last that many tokens (the end of a prompt is the question being asked). With a
    ``chat_template`` the prompts are rendered first and tokenized without added specials."""
    texts = apply_chat_template(tokenizer, prompts, chat_template)
    special = chat_template is None
    if max_prompt_tokens is None:
        return dict(tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=special))
    ids = [
        row[-max_prompt_tokens:]
        for row in tokenizer(texts, add_special_tokens=special)["input_ids"]
    ]
    return dict(tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt"))


def _decode(
    tokenizer: PreTrainedTokenizerBase,
    tokens: torch.Tensor,
    response_lens: torch.Tensor,
    truncated: torch.Tensor,
) -> list[str]:
    """Decode each response up to EOS (exclusive)."""
    text_lens = (response_lens - (~truncated).long()).tolist()
    rows = tokens.tolist()
    return tokenizer.batch_decode(
        [row[:n] for row, n in zip(rows, text_lens, strict=True)], skip_special_tokens=True
    )


class StalenessRing:
    """Past policy weights, so rollouts can be sampled by the policy as it was k updates ago.

    Emulates AReaL's asynchronous off-policy setting (``max_head_offpolicyness``) on one
    machine: ``push(model)`` after every update keeps the newest ``k + 1`` snapshots;
    ``behaviour_state()`` is the oldest kept (k updates behind once the ring has filled, fewer
    before). With ``k = 0`` nothing is copied and the live model is the behaviour policy.
    Snapshots are detached clones on the model's device.
    """

    def __init__(self, k: int, *, trainable_only: bool = False) -> None:
        if k < 0:
            raise ValueError(f"staleness must be >= 0; got {k}")
        self.k = k
        # Under LoRA only the adapters change: snapshot those, not the frozen base.
        self.trainable_only = trainable_only
        self._ring: collections.deque[dict[str, torch.Tensor]] = collections.deque(maxlen=k + 1)

    def push(self, model: torch.nn.Module) -> None:
        if self.k == 0:
            return
        with torch.no_grad():
            if self.trainable_only:
                snap = {
                    n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad
                }
            else:
                snap = {n: t.detach().clone() for n, t in model.state_dict().items()}
            self._ring.append(snap)

    def behaviour_state(self) -> dict[str, torch.Tensor] | None:
        """The oldest kept snapshot, or None when k == 0 or nothing was pushed yet."""
        return self._ring[0] if self._ring else None

    @property
    def lag(self) -> int:
        """How many updates the behaviour snapshot is behind the newest pushed weights."""
        return max(len(self._ring) - 1, 0)


__all__ = [
    "RolloutBatch",
    "StalenessRing",
    "assemble_batch",
    "encode_prompts",
    "forward_logprobs",
    "position_ids",
    "sample",
]
