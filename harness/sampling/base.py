"""The sampler contract: what every rollout backend takes and returns.

A backend (``harness/sampling/local.py``, ``harness/sampling/vllm.py``; the list:
:mod:`harness.sampling.registry`) is a :class:`Sampler`: it is given the weights to sample with
(:meth:`Sampler.load`, which syncs only when their version changed), samples ``n_samples``
completions per prompt (:meth:`Sampler.generate`) and returns a :class:`RolloutBatch` in token
layout with its behaviour log-probs and the policy version of every generated token.

Token layout, shared by everything downstream: a batch is ``[B, L]`` with ``L = P + T``: each row
is its left-padded prompt (width ``P``, the longest prompt), then its response, then right padding
(pad id) up to ``T`` (the longest response). Per-token quantities live at the position of the token
they describe: ``logprobs[b, j]`` is log pi(input_ids[b, j] | prefix), ``loss_mask[b, j]`` is 1
exactly on generated tokens (EOS included when produced); ``attention_mask`` is the prompt mask
followed by ``loss_mask``; ``versions[b, j]`` is the policy version that generated the token (-1 on
prompt and padding positions). Rows come in groups: the ``n_samples`` samples of prompt i are rows
``i*n .. i*n+n-1``. ``completions`` are decoded up to EOS (exclusive) with
``skip_special_tokens=True``.

Behaviour log-probs are those of the tempered, untruncated distribution
``log_softmax(logits / temperature)`` (what :func:`harness.model.logprobs.forward_logprobs`
recomputes), whichever backend sampled.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, NamedTuple, Self

import torch
from transformers import PreTrainedTokenizerBase

from harness.model.prompting import apply_chat_template


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
    # [B, L] the policy version that generated each token, -1 elsewhere (None: not recorded)
    versions: torch.Tensor | None = None

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


def repeated_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    n_samples: int,
    max_new_tokens: int,
    *,
    max_prompt_tokens: int | None = None,
    max_positions: int | None = None,
    chat_template: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The left-padded prompt ids and mask of ``prompts`` (:func:`encode_prompts`), each repeated
    ``n_samples`` times (rows ``i*n .. i*n+n-1``), on the CPU: what every sampler starts from.
    A ``ValueError`` when the longest prompt and ``max_new_tokens`` do not fit the model's
    ``max_positions``."""
    enc = encode_prompts(tokenizer, prompts, max_prompt_tokens, chat_template)
    prompt_ids = enc["input_ids"].repeat_interleave(n_samples, dim=0)
    prompt_mask = enc["attention_mask"].repeat_interleave(n_samples, dim=0)
    longest = int(prompt_mask.sum(-1).max())
    if max_positions is not None and longest + max_new_tokens > max_positions:
        raise ValueError(
            f"rollout: a prompt of {longest} tokens + max_new_tokens {max_new_tokens} exceeds "
            f"the model's {max_positions} positions (set rollout.max_prompt_tokens)"
        )
    return prompt_ids, prompt_mask


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


def with_versions(rb: RolloutBatch, version: int) -> RolloutBatch:
    """``rb`` with ``versions`` set: ``version`` on every generated token, -1 elsewhere."""
    rb.versions = torch.where(rb.loss_mask.bool(), version, -1).to(torch.long)
    return rb


@dataclass(frozen=True)
class SamplingParams:
    """What one :meth:`Sampler.generate` call samples: ``n_samples`` completions per prompt of at
    most ``max_new_tokens`` tokens, from ``log_softmax(logits / temperature)`` (nucleus
    ``top_p``), or the argmax with ``greedy`` (evaluation)."""

    n_samples: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False


class GenerateCall(NamedTuple):
    """One :meth:`Sampler.generate` call's arguments, as a backend's :meth:`Sampler._generate`
    receives them (one value, so the backends do not each restate the public signature)."""

    tokenizer: PreTrainedTokenizerBase
    prompts: list[str]
    params: SamplingParams
    generator: torch.Generator


class Closing:
    """A context manager whose exit is :meth:`close` (idempotent; nothing by default): the
    lifecycle of both sampler contracts (:class:`Sampler` and the step-level one)."""

    def close(self) -> None:
        """Release what the backend holds (idempotent); nothing by default."""
        return None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Sampler(Closing, abc.ABC):
    """A rollout backend (module docstring). Used as a context manager; :meth:`close` is
    idempotent. Every backend is built as ``cls(device, spec, sample_kw)``: ``spec`` its settings
    (a ``spec_type``), ``sample_kw`` the prompt settings. Subclasses declare ``spec_type`` and
    implement :meth:`_sync` (copy the weights in) and :meth:`_generate` (and :meth:`_setup`).

    ``copies_weights``: whether loading weights costs a copy (an engine holding its own copy);
    the loop reports ``perf/weight_sync_s`` only for such a backend."""

    copies_weights: bool = False
    # The backend's settings: a frozen dataclass whose defaults stand when no ``spec`` is given.
    spec_type: ClassVar[type[Any]]

    def __init__(
        self,
        device: torch.device,
        spec: Any = None,
        sample_kw: dict[str, Any] | None = None,  # EOS ids, truncation, positions, template
    ) -> None:
        self.device = device
        self.spec = spec if spec is not None else self.spec_type()
        self.sample_kw = dict(sample_kw or {})
        self.model: Any = None  # the weights loaded (the policy module)
        self.version: int | None = None
        self.syncs = 0
        self.sync_seconds = 0.0
        self.closed = False
        self._setup()

    def _setup(self) -> None:
        """What the backend builds from ``spec`` when constructed (nothing by default)."""
        return None

    # ---- weights
    def load(self, weights: Any, version: int) -> None:
        """Sample with ``weights`` (the policy module) from now on; they are copied in only when
        ``version`` differs from the one loaded (a refill round reuses what is loaded)."""
        if self.closed:
            raise RuntimeError("sampler: load after close")
        self.model = weights
        if version == self.version:
            return
        self.sync_seconds += self._sync(weights)
        self.syncs += 1
        self.version = version

    @abc.abstractmethod
    def _sync(self, weights: Any) -> float:
        """Copy ``weights`` in (nothing for a backend that samples the module itself); the
        seconds the copy took (a backend's start before its first copy is not counted)."""

    # ---- sampling
    def generate(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompts: list[str],
        params: SamplingParams,
        generator: torch.Generator,
    ) -> RolloutBatch:
        """``params.n_samples`` completions of every prompt from the loaded weights, with their
        behaviour log-probs and the loaded version on every generated token."""
        if self.model is None or self.version is None:
            raise RuntimeError("sampler: generate before load")
        rb = self._generate(GenerateCall(tokenizer, prompts, params, generator))
        return with_versions(rb, self.version)

    @abc.abstractmethod
    def _generate(self, call: GenerateCall) -> RolloutBatch:
        """The backend's batch for ``call`` (versions are set by :meth:`generate`)."""

    # ---- lifecycle
    def stats(self) -> dict[str, float]:
        """Weight syncs so far and the seconds they took."""
        return {"syncs": float(self.syncs), "sync_seconds": self.sync_seconds}

    def close(self) -> None:
        """Release what the backend holds (idempotent)."""
        self.closed = True
        self.model = None
        self._close()

    def _close(self) -> None:
        """The backend's own release (an engine's shutdown); nothing by default."""
        return None


__all__ = [
    "Closing",
    "GenerateCall",
    "NonFiniteLogits",
    "RolloutBatch",
    "Sampler",
    "SamplingParams",
    "assemble_batch",
    "encode_prompts",
    "repeated_prompts",
    "with_versions",
]
