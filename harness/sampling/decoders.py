"""The two decoders :func:`harness.sampling.local.sample` steps: :class:`_LlamaDecoder`, a
functional replay of a Llama-shaped model's weights over preallocated KV buffers (about 2x faster
per token than calling the HF module), and :class:`_HFDecoder`, any causal LM through its own
``forward`` and a ``DynamicCache``. Both take one token per row and a position per row and return
the next logits, so the sampling loop is the same over either (and samples identical tokens).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from transformers import (
    LlamaForCausalLM,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2ForCausalLM,
)
from transformers.cache_utils import DynamicCache


class _HFDecoder:
    """Any causal LM through its own ``forward`` and a ``DynamicCache`` (the portable path)."""

    def __init__(self, model: PreTrainedModel, prompt_mask: torch.Tensor, max_new_tokens: int):
        self.model = model
        n_rows, self.width = prompt_mask.shape
        self.mask = prompt_mask.new_ones(n_rows, self.width + max_new_tokens)
        self.mask[:, : self.width] = prompt_mask
        # transformers 5 renamed ``past_key_values`` to ``cache``; pass whichever forward takes
        # (a peft wrapper forwards **kwargs, so look at the model it wraps).
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
        params = inspect.signature(inner.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.prefill_kw: dict[str, Any] = (
            {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        )
        try:
            self.cache: Any = DynamicCache(config=model.config)
        except TypeError:  # older transformers
            self.cache = DynamicCache()

    def prefill(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=self.mask[:, : self.width],
            position_ids=pos,
            use_cache=True,
            **self.prefill_kw,
            **{self.cache_kw: self.cache},
        )
        return out.logits[:, -1, :]

    def refresh(self) -> None:
        """Nothing to re-read: every step calls the module, whose weights are the current ones."""

    def step(self, tok: torch.Tensor, pos: torch.Tensor, t: int) -> torch.Tensor:
        out = self.model(
            input_ids=tok,
            attention_mask=self.mask[:, : self.width + t + 1],
            position_ids=pos,
            use_cache=True,
            **{self.cache_kw: self.cache},
        )
        return out.logits[:, -1, :]


_STATIC_ROPE = ("default", "linear", "llama3")


# Architectures whose decoder layer is Llama's, module for module (RMSNorm -> attention with
# RoPE -> RMSNorm -> SwiGLU; Qwen2 adds q/k/v biases, which _joined carries). Gemma is not: it
# scales embeddings, offsets norm weights and (Gemma2) soft-caps logits.
_FAST_TYPES = (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM)


def _fast_path_ok(model: PreTrainedModel) -> bool:
    """Whether :class:`_LlamaDecoder` computes exactly what ``model.forward`` computes."""
    if type(model) not in _FAST_TYPES:  # exact types: subclasses may change forward
        return False
    cfg = model.config
    # Sliding-window attention (Mistral v0.1, Qwen2 with use_sliding_window) masks differently.
    if getattr(cfg, "sliding_window", None) is not None and type(model) is MistralForCausalLM:
        return False
    if any(getattr(layer.self_attn, "sliding_window", None) for layer in model.model.layers):
        return False
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    return (
        rope_type in _STATIC_ROPE
        and getattr(cfg, "pretraining_tp", 1) == 1
        and hasattr(model.model, "rotary_emb")
        and not (model.training and (cfg.attention_dropout or 0.0) > 0)
    )


def _joined(*linears: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weights (and biases) of several Linear layers stacked into one, for a single matmul."""
    weight = torch.cat([lin.weight for lin in linears], dim=0)
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return weight, None
    bias = torch.cat(
        [
            b if b is not None else lin.weight.new_zeros(lin.weight.shape[0])
            for b, lin in zip(biases, linears, strict=True)
        ]
    )
    return weight, bias


class _LlamaDecoder:
    """A functional re-statement of the Llama forward for sampling: same weights, same math.

    Why: ``LlamaForCausalLM.forward`` spends most of a tiny model's step in Python (kwarg
    plumbing, output dataclasses, mask construction, cache objects). This decoder reads the
    module's weights and replays RMSNorm -> attention with RoPE -> SwiGLU MLP with plain tensor
    ops over preallocated KV buffers, which halves the time per sampled token on CPU. RoPE tables
    come from the model's own ``rotary_emb``, so any static RoPE variant matches. Only used when
    :func:`_fast_path_ok`; a test checks token-for-token agreement with the HF path and
    log-prob agreement with :func:`forward_logprobs`.
    """

    def __init__(self, model: LlamaForCausalLM, prompt_mask: torch.Tensor, max_new_tokens: int):
        base = model.model
        cfg = model.config
        emb = base.embed_tokens.weight
        n_rows, self.width = prompt_mask.shape
        total = self.width + max_new_tokens
        attn0 = base.layers[0].self_attn
        self.head_dim = int(attn0.head_dim)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(cfg.num_key_value_heads or cfg.num_attention_heads)
        self.scaling = float(attn0.scaling)
        self.gqa = self.n_heads != self.n_kv
        self.model = model
        self.k_buf = [emb.new_zeros(n_rows, self.n_kv, total, self.head_dim) for _ in base.layers]
        self.v_buf = [emb.new_zeros(n_rows, self.n_kv, total, self.head_dim) for _ in base.layers]
        cos, sin = base.rotary_emb(
            emb[:1].unsqueeze(0), torch.arange(total, device=emb.device)[None]
        )
        self.cos, self.sin = cos[0], sin[0]  # [total, head_dim]
        # Additive masks, finite (finfo.min) so left-padding query rows stay NaN-free.
        neg = torch.finfo(emb.dtype).min
        valid = torch.ones(n_rows, total, dtype=torch.bool, device=emb.device)
        valid[:, : self.width] = prompt_mask.bool()
        self.key_bias = emb.new_zeros(n_rows, 1, 1, total).masked_fill_(~valid[:, None, None], neg)
        causal = torch.ones(self.width, self.width, dtype=torch.bool, device=emb.device).tril_()
        allowed = causal[None, None] & valid[:, None, None, : self.width]
        self.prompt_bias = emb.new_zeros(n_rows, 1, self.width, self.width).masked_fill_(
            ~allowed, neg
        )
        self.refresh()
        self.q_dim = self.n_heads * self.head_dim
        self.kv_dim = self.n_kv * self.head_dim
        self.ff_dim = int(base.layers[0].mlp.gate_proj.weight.shape[0])

    def refresh(self) -> None:
        """Re-read the weights this decoder joined: after the module's weights changed in
        place (an in-flight update that keeps the KV cache), the next step uses the new ones.
        One matmul for q/k/v and one for gate/up per layer (weights joined once per call)."""
        self.qkv = []
        self.gate_up = []
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            self.qkv.append(_joined(a.q_proj, a.k_proj, a.v_proj))
            self.gate_up.append(_joined(m.gate_proj, m.up_proj))

    @staticmethod
    def _rms(x: torch.Tensor, norm: Any) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return norm.weight * xf.to(x.dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def _forward(
        self, ids: torch.Tensor, pos: torch.Tensor, start: int, bias: torch.Tensor
    ) -> torch.Tensor:
        n, s = ids.shape
        base = self.model.model
        h = F.embedding(ids, base.embed_tokens.weight)
        cos = self.cos[pos].unsqueeze(1)
        sin = self.sin[pos].unsqueeze(1)
        end = start + s
        for i, layer in enumerate(base.layers):
            attn, mlp = layer.self_attn, layer.mlp
            x = self._rms(h, layer.input_layernorm)
            q, k, v = F.linear(x, *self.qkv[i]).split(
                (self.q_dim, self.kv_dim, self.kv_dim), dim=-1
            )
            q = self._rope(q.view(n, s, self.n_heads, self.head_dim).transpose(1, 2), cos, sin)
            k = self._rope(k.view(n, s, self.n_kv, self.head_dim).transpose(1, 2), cos, sin)
            self.k_buf[i][:, :, start:end] = k
            self.v_buf[i][:, :, start:end] = v.view(n, s, self.n_kv, self.head_dim).transpose(1, 2)
            o = F.scaled_dot_product_attention(
                q,
                self.k_buf[i][:, :, :end],
                self.v_buf[i][:, :, :end],
                attn_mask=bias,
                scale=self.scaling,
                enable_gqa=self.gqa,
            )
            o = o.transpose(1, 2).reshape(n, s, self.n_heads * self.head_dim)
            h = h + F.linear(o, attn.o_proj.weight, attn.o_proj.bias)
            x = self._rms(h, layer.post_attention_layernorm)
            gate, up = F.linear(x, *self.gate_up[i]).split((self.ff_dim, self.ff_dim), dim=-1)
            h = h + F.linear(mlp.act_fn(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        h = self._rms(h[:, -1], base.norm)
        head = self.model.lm_head
        return F.linear(h, head.weight, head.bias)

    def prefill(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self._forward(ids, pos, 0, self.prompt_bias)

    def step(self, tok: torch.Tensor, pos: torch.Tensor, t: int) -> torch.Tensor:
        start = self.width + t
        return self._forward(tok, pos, start, self.key_bias[..., : start + 1])
