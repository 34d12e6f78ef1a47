"""The local sampler: the policy module itself, sampled in the run's process by a lean KV-cache
loop that records behaviour log-probs (backend ``local``; its ``decoder`` option picks the step).

Why not ``model.generate``: for a 2-layer model the per-token cost is Python overhead, and
``generate`` adds a logits-processor pipeline, stopping criteria, cache bookkeeping and output
objects on every step. The loop below does one forward for the prompts and one per new token,
samples with an explicit ``torch.Generator`` (so a run's sampling stream is reproducible and
independent of the global RNG), and stops as soon as every row has emitted EOS. For a plain
``LlamaForCausalLM`` (the tiny model), ``Qwen2ForCausalLM`` or ``MistralForCausalLM`` (no sliding
window) each step goes through :class:`~harness.sampling.decoders._LlamaDecoder`, a
functional replay of the same weights over preallocated KV buffers (about 2x faster per token
than calling the HF module); any other causal LM goes through its own ``forward`` with a
``DynamicCache``. Both paths sample identical tokens for the same generator (tested).

Layout: :mod:`harness.sampling.base` (token layout).

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

from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from harness.model.build import eos_ids, precision
from harness.model.logprobs import position_ids
from harness.sampling.base import (
    GenerateCall,
    NonFiniteLogits,
    RolloutBatch,
    Sampler,
    assemble_batch,
    repeated_prompts,
)
from harness.sampling.decoders import _fast_path_ok, _HFDecoder, _LlamaDecoder
from harness.sampling.registry import register


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail outside the smallest set of tokens whose mass reaches ``top_p``."""
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    cum = sorted_p.cumsum(-1)
    drop = (cum - sorted_p) >= top_p  # keep the token that crosses the threshold
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(-1, idx, sorted_p)


def draw_token(
    logits: torch.Tensor,
    t: int,
    *,
    generator: torch.Generator,
    inv_t: float,
    top_p: float,
    greedy: bool,
    logit_noise: float = 0.0,
    noise_generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from ``logits`` ``[N, V]`` (new token ``t``) and its behaviour
    log-prob under ``log_softmax(logits · inv_t)``: the one sampling step of every local decode
    loop (whole batches here, step-level cohorts in :mod:`harness.sampling.local_steps`)."""
    if logit_noise > 0:
        noise = torch.randn(
            logits.shape, generator=noise_generator, device=logits.device, dtype=torch.float32
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
    return tok.squeeze(-1), logp.gather(-1, tok).squeeze_(-1)


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
        tok, lp = draw_token(
            logits,
            t,
            generator=generator,
            inv_t=inv_t,
            top_p=top_p,
            greedy=greedy,
            logit_noise=logit_noise,
            noise_generator=noise_generator,
        )
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
    fast = _checked_fast(
        model, n_samples, max_new_tokens, temperature, top_p, backend, logit_noise, noise_generator
    )
    prompt_ids, prompt_mask, eos, pad_id = prepare_prompts(
        model,
        tokenizer,
        prompts,
        n_samples,
        max_new_tokens,
        eos_token_ids=eos_token_ids,
        max_prompt_tokens=max_prompt_tokens,
        max_positions=max_positions,
        chat_template=chat_template,
    )
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


def _checked_fast(
    model: PreTrainedModel,
    n_samples: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    backend: str,
    logit_noise: float,
    noise_generator: torch.Generator | None,
) -> bool:
    """:func:`sample`'s arguments checked (ValueError naming the first bad one); whether the
    fast decoder steps ``model``."""
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
    return fast


def prepare_prompts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    n_samples: int,
    max_new_tokens: int,
    *,
    eos_token_ids: list[int] | None = None,
    max_prompt_tokens: int | None = None,
    max_positions: int | None = None,
    chat_template: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The left-padded prompt ids and mask of ``prompts``, each repeated ``n_samples`` times
    (rows ``i*n .. i*n+n-1``), on the model's device; the EOS ids as a tensor; the pad id. The
    options are :func:`sample`'s."""
    device = next(model.parameters()).device
    if eos_token_ids is None:
        eos_token_ids = eos_ids(model, tokenizer)
    eos_id = eos_token_ids[0]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    prompt_ids, prompt_mask = repeated_prompts(
        tokenizer,
        prompts,
        n_samples,
        max_new_tokens,
        max_prompt_tokens=max_prompt_tokens,
        max_positions=max_positions,
        chat_template=chat_template,
    )
    eos = torch.tensor(eos_token_ids, dtype=torch.long, device=device)
    return prompt_ids.to(device), prompt_mask.to(device), eos, pad_id


DECODERS = ("auto", "fast", "hf")


@dataclass(frozen=True)
class LocalSpec:
    """How the local sampler samples: under ``torch.autocast(dtype)`` (None = float32, autocast
    off), stepped by ``decoder`` (``DECODERS``), with ``logit_noise`` σ of Gaussian noise on the
    logits drawn from a stream seeded with ``noise_seed``. What the batch sampler and the
    step-level one (:class:`~harness.sampling.local_steps.LocalStepSampler`) share."""

    dtype: torch.dtype | None = None
    decoder: str = "auto"
    logit_noise: float = 0.0
    noise_seed: int | None = None

    def noise_stream(self, device: torch.device) -> torch.Generator | None:
        """A fresh noise stream on ``device`` (None when the noise is off or has no seed)."""
        if self.logit_noise > 0 and self.noise_seed is not None:
            return torch.Generator(device=device).manual_seed(self.noise_seed)
        return None


@register(
    "local",
    options={
        "decoder": "auto = the functional Llama/Qwen2/Mistral decoder when it applies, else the "
        "model's own forward; fast = insist on the former; hf = always the latter",
        "dtype": "autocast dtype of the sampler's forward (None = float32: autocast off)",
        "logit_noise": "σ of seeded Gaussian noise on the logits (0 = off)",
        "noise_seed": "seed of the noise stream (logit_noise > 0)",
    },
)
class LocalSampler(Sampler):
    """The in-process sampler: :func:`sample` of the loaded policy module as ``spec`` says
    (:class:`LocalSpec`). Loading weights copies nothing: the module itself is sampled."""

    spec_type = LocalSpec
    spec: LocalSpec

    def _setup(self) -> None:
        self.noise_generator = self.spec.noise_stream(self.device)

    def _sync(self, weights: Any) -> float:
        return 0.0

    def _generate(self, call: GenerateCall) -> RolloutBatch:
        with precision(self.device, self.spec.dtype):
            return sample(
                self.model,
                call.tokenizer,
                call.prompts,
                generator=call.generator,
                backend=self.spec.decoder,
                logit_noise=self.spec.logit_noise,
                noise_generator=self.noise_generator,
                # sample()'s keywords are named after the SamplingParams fields.
                **asdict(call.params),
                **self.sample_kw,
            )


__all__ = ["DECODERS", "LocalSampler", "LocalSpec", "draw_token", "prepare_prompts", "sample"]
